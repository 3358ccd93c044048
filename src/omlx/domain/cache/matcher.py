"""Matching a prompt against the tiers: the longest cached prefix, to the token, pinned.

Matching is token-granular without changing the key contract (``keys``): whole blocks
are matched by key, RAM then disk; where that walk stops, every stored child of the last
matched key (a full block with another tail, or a request's trailing partial block)
serves its leading tokens that equal the prompt's, since KV at position ``j`` depends
only on tokens ``<= j``. So a follow-up turn or a replay recomputes its new tokens, not
up to ``block_size - 1`` more. Hybrid layouts settle on a restore point
(``point_finder``). What a hit uses stays pinned in RAM until its lease is released.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import replace
from typing import Any

from omlx.domain.cache.blocks import HOT, SSD, BlockMeta, NamespaceInfo, PrefixHit, PromptChain
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keeper import KnownKeys
from omlx.domain.cache.keys import block_key, chain_keys, iter_chain_keys
from omlx.domain.cache.layout import CacheLayout
from omlx.domain.cache.origins import RestoredTokens, origin_of
from omlx.domain.cache.partial_match import PartialMatch, best_child, held_past
from omlx.domain.cache.point_finder import FoundPoint, RestorePointFinder
from omlx.domain.cache.ports import ColdSource, KVCodec
from omlx.domain.cache.tally import Tally
from omlx.domain.ports import Clock

log = logging.getLogger(__name__)

# How long a probe's index answer is reused by the lookup that follows it (the request was
# queued no longer). Past it the keys are reused and the index asked again: a block
# written meanwhile (by another server on a shared index) would be missed otherwise.
PROBE_FRESH_S = 2.0

# Where each matched block came from: its tier and the server that computed it.
Source = tuple[str, str]


class PrefixMatcher:
    """Looks prompts up in the hot tier, then the cold source; hands out and takes back leases."""

    def __init__(
        self,
        *,
        namespace: NamespaceInfo,
        codec: KVCodec,
        hot: HotTier,
        cold: ColdSource | None,
        layout: CacheLayout,
        known: KnownKeys,
        tally: Tally,
        clock: Clock,
        server_id: str = "",
    ) -> None:
        self.namespace = namespace
        self.server_id = server_id
        self.restored = RestoredTokens()  # hit tokens by tier and origin
        self.block_size = namespace.block_size
        self.layout = layout
        self._codec, self._hot, self._cold = codec, hot, cold
        self._known, self._tally, self._clock = known, tally, clock
        self._leases: dict[int, tuple[str, ...]] = {}
        self._lease_ids = itertools.count(1)
        self._lock = threading.Lock()  # the leases, for readers on other threads
        self._points = RestorePointFinder(
            namespace=namespace.digest,
            block_size=self.block_size,
            layout=layout,
            codec=codec,
            hot=hot,
            cold=cold,
            read_cold=self._read_cold,
            remember=known.remember,
        )

    @property
    def active_leases(self) -> int:
        with self._lock:
            return len(self._leases)

    def lookup(
        self,
        tokens: Sequence[int],
        *,
        store: bool = True,
        root: str | None = None,
        chain: PromptChain | None = None,
    ) -> PrefixHit:
        """The longest cached prefix of ``tokens``, to the token, pinned for this request.

        Whole blocks first (by key, RAM then disk), then the best child of the last
        matched key. Never the whole prompt: at least one token is left to prefill, so
        the engine always has logits to sample from. ``store=False`` (a no-store request):
        blocks read from disk are not put in RAM (nothing is evicted for them) and no
        recency is recorded on disk (the index is left as it was). ``root``: a tenant's
        chain root (``keys.tenant_root``) instead of the namespace's. ``chain``: what the
        request's probe hashed and asked of the index (``CachedPrefix.chain``), reused
        while fresh instead of hashing the prompt and asking again.
        """
        bs = self.block_size
        max_blocks = max((len(tokens) - 1) // bs, 0)
        keys: list[str] = []
        payloads: list[Any] = []
        sources: list[Source] = []  # one per key
        hot_keys: list[str] = []
        cold_hits = 0
        partial = 0
        parent = root or self.namespace.digest
        known = self._usable(chain, parent, max_blocks)
        try:
            # RAM, block by block (keys chained lazily, as ``chain_keys``) to its first miss.
            walk = known.keys if known is not None else None
            for key in walk or iter_chain_keys(parent, tokens[: max_blocks * bs], bs):
                block = self._hot.get(key)
                if block is None:
                    break
                self._take(key, block.payload, keys, payloads)
                sources.append((HOT, block.meta.computed_by))
                hot_keys.append(key)
                parent = key
            if len(keys) < max_blocks and self._cold is not None:
                cold_hits = self._walk_cold(
                    tokens, max_blocks, parent, keys, payloads, sources, hot_keys, store, known
                )
                parent = keys[-1] if keys else parent
            n_hot = len(hot_keys)
            evicted = self._next_was_kept(tokens, len(keys), max_blocks, parent, known)
            match = self._best_child(tokens, len(keys) * bs, parent, store, known)
            listed = known.children if known is not None and known.children_of == parent else ()
            stored_next = held_past(match, parent, self._hot.children, listed)
            if match is not None:
                partial = match.shared
                payloads.append(self._codec.truncate(match.payload, partial))
                self._hot.pin((match.meta.key,))
                keys.append(match.meta.key)
                sources.append((HOT if match.from_hot else SSD, match.meta.computed_by))
                if match.from_hot:
                    hot_keys.append(match.meta.key)
            n_full = len(keys) - (1 if match is not None else 0)
            point = None
            if not self.layout.plain:
                point = self._points.find(tokens, keys[:n_full], n_full * self.block_size + partial)
                keys, payloads, partial, n_hot, cold_hits = self._points.clamp(
                    point, keys, payloads, partial, n_hot, cold_hits
                )
                del sources[len(keys) :]
        except BaseException:
            self._hot.unpin(keys)  # no lease was handed out: do not leak the pins
            raise
        if self._cold is not None and hot_keys and store:
            self._cold.touch(hot_keys)  # served from RAM: keep them young on disk too
        matched = n_full * self.block_size + (match.shared if match is not None else 0)
        hit = self._record_hit(
            len(tokens), keys, payloads, n_hot, cold_hits, partial, point, matched
        )
        self._count_sources(sources, partial)
        hit = replace(
            hit,
            partial_from_disk=bool(partial and match is not None and not match.from_hot),
            stored_next=stored_next,
            computed_by=sources[-1][1] if sources else "",
            evicted=evicted,
        )
        return hit

    def _next_was_kept(
        self,
        tokens: Sequence[int],
        n_full: int,
        max_blocks: int,
        parent: str,
        known: PromptChain | None,
    ) -> bool:
        """Whether the prompt's block after the ``n_full`` matched ones was queued for (or read
        from) the cold tier by this process, though neither tier holds it now: it was kept
        once and evicted since, not a block no request ever computed."""
        if n_full >= max_blocks:
            return False
        if known is not None:
            key = known.keys[n_full]
        else:
            bs = self.block_size
            key = block_key(parent, tokens[n_full * bs : (n_full + 1) * bs])
        return key in self._known

    def _count_sources(self, sources: Sequence[Source], partial: int) -> None:
        """Count the restored tokens by tier and origin: a whole block each, the partly
        used last one its ``partial`` tokens (together: the hit's ``cached_tokens``)."""
        last = len(sources) - 1
        self.restored.add(
            (
                tier,
                origin_of(by, self.server_id),
                partial if partial and i == last else self.block_size,
            )
            for i, (tier, by) in enumerate(sources)
        )

    def _usable(self, chain: PromptChain | None, root: str, max_blocks: int) -> PromptChain | None:
        """``chain`` if it is this prompt's from this root and asked recently enough that the
        index's answer still holds (else a block written since would be missed)."""
        if chain is None or chain.root != root or len(chain.keys) != max_blocks:
            return None
        if self._clock.now() - chain.asked_at > PROBE_FRESH_S:
            # The keys still hold; the index is asked again.
            return replace(chain, rows=None, children_of=None, children=())
        return chain

    def release(self, hit: PrefixHit) -> None:
        """Unpin the hit's blocks; releasing twice is harmless."""
        with self._lock:
            keys = self._leases.pop(hit.lease, None)
        if keys:
            self._hot.unpin(keys)

    def drop(self, hit: PrefixHit) -> None:
        """Unpin the hit's blocks and remove them from RAM and disk: a restore could not
        use them, so they are recomputed (and stored again) rather than served again."""
        with self._lock:
            leased = self._leases.pop(hit.lease, None)
        if leased:
            self._hot.unpin(leased)
        keys = tuple(dict.fromkeys((*hit.keys, *(leased or ()))))
        self._hot.discard(keys)
        self._known.discard(keys)
        if self._cold is not None:
            self._cold.forget(list(keys))

    def _best_child(
        self,
        tokens: Sequence[int],
        start: int,
        parent: str,
        store: bool = True,
        known: PromptChain | None = None,
    ) -> PartialMatch | None:
        """The child of ``parent`` continuing ``tokens[start:]`` the furthest (promoted to RAM).

        Capped so one token is left to prefill; disk is asked only when RAM could be beaten
        (and not at all when the probe listed ``parent``'s children: ``known``).
        """
        want = tuple(tokens[start : start + max(min(len(tokens) - 1 - start, self.block_size), 0)])
        if not want:
            return None
        cold = self._cold
        listed = None
        if known is not None and known.children_of == parent:
            listed = known.children

        def disk_children() -> Sequence[BlockMeta]:
            assert cold is not None
            return listed if listed is not None else cold.children(parent, want)

        match = best_child(
            want,
            self._hot.children(parent),
            disk_children if cold is not None else None,
            lambda meta: self._read_cold(meta.key, parent, touch=store),
        )
        if match is None:
            return None
        if not store:
            return match
        if match.from_hot:
            self._hot.touch(match.meta.key)
        else:  # promoted whole: the next lookup finds it in RAM
            self._hot.put(
                match.meta,
                match.tokens,
                match.payload,
                self._codec.nbytes(match.payload),
                reused=True,
            )
            self._known.remember(match.meta.key)
        return match

    def _take(self, key: str, payload: Any, keys: list[str], payloads: list[Any]) -> None:
        # Pin as we go: promoting a later cold block must not evict an earlier match.
        self._hot.pin((key,))
        keys.append(key)
        payloads.append(payload)

    def _walk_cold(
        self,
        tokens: Sequence[int],
        max_blocks: int,
        parent: str,
        keys: list[str],
        payloads: list[Any],
        sources: list[Source],
        hot_keys: list[str],
        store: bool = True,
        known: PromptChain | None = None,
    ) -> int:
        """Extend the match past RAM's first miss; returns how many blocks came from disk.

        The rest of the chain is asked of the cold source in one batch (read ahead
        while this thread decodes); blocks RAM still holds are taken from RAM. The
        walk ends at the first block neither has. ``known``: the probe's keys and rows.
        The rows (the probe's, else asked here, as the batch would ask) say who computed
        each block read.
        """
        assert self._cold is not None
        bs = self.block_size
        start = len(keys)
        if known is not None:
            rest = list(known.keys[start:max_blocks])
        else:
            rest = chain_keys(parent, tokens[start * bs : max_blocks * bs], bs)
        parents = [parent, *rest[:-1]]
        wanted = [(k, p) for k, p in zip(rest, parents, strict=True) if k not in self._hot]
        rows = None
        if known is not None and known.rows is not None and start >= known.asked_from:
            rows = known.rows  # the probe asked the index for every key from here on
        elif wanted:
            rows = self._cold.rows([k for k, _ in wanted])
            if rows is None:  # the index did not answer: a miss, as the batch's would be
                return 0
        cold_hits = planned = 0
        with closing(self._cold.get_many(wanted, touch=store, rows=rows)) as batch:
            for j, (key, parent_key) in enumerate(zip(rest, parents, strict=True)):
                block_tokens = tuple(tokens[(start + j) * bs : (start + j + 1) * bs])
                row = rows.get(key) if rows is not None else None
                computed_by = (row.computed_by or "") if row is not None else ""
                if planned < len(wanted) and wanted[planned][0] == key:
                    planned += 1
                    found = self._next(batch, key)
                else:
                    block = self._hot.get(key)
                    if block is not None:
                        self._take(key, block.payload, keys, payloads)
                        sources.append((HOT, block.meta.computed_by))
                        hot_keys.append(key)
                        continue
                    # Left RAM since the batch was planned (a promotion evicted it).
                    found = self._read_cold(key, parent_key, touch=store)
                payload = self._promote(key, parent_key, block_tokens, found, store, computed_by)
                if payload is None:
                    break
                self._take(key, payload, keys, payloads)
                sources.append((SSD, computed_by))
                cold_hits += 1
        return cold_hits

    @staticmethod
    def _next(
        batch: Iterator[tuple[Sequence[int], Any]], key: str
    ) -> tuple[tuple[int, ...], Any] | None:
        """The batch's next block (``key``), or None when it ended (a miss) or failed."""
        try:
            found = next(batch, None)
        except OSError:
            # The port promises not to raise; a disk error must still never fail a request.
            log.exception("cold tier read of %s failed; treated as a miss", key)
            return None
        return None if found is None else (tuple(found[0]), found[1])

    def _read_cold(
        self, key: str, parent: str, *, touch: bool = True
    ) -> tuple[tuple[int, ...], Any] | None:
        """A verified read from the cold source (checksum, rehash to ``key``); None on a miss."""
        assert self._cold is not None
        try:
            found = self._cold.get(key, parent, touch=touch)
        except OSError:
            # The port promises not to raise; a disk error must still never fail a request.
            log.exception("cold tier read of %s failed; treated as a miss", key)
            return None
        if found is None:
            return None
        return tuple(found[0]), found[1]

    def _promote(
        self,
        key: str,
        parent: str,
        block_tokens: tuple[int, ...],
        found: tuple[tuple[int, ...], Any] | None,
        store: bool = True,
        computed_by: str = "",
    ) -> Any | None:
        """Put a block read from the cold source into RAM; its payload, or None on a miss.

        Not for a no-store request (``store=False``): it only uses the payload. In RAM it
        keeps ``computed_by`` (its row's), so a later hit on it still says whose it is.
        """
        if found is None:
            return None
        stored_tokens, payload = found
        if stored_tokens != block_tokens:
            log.warning(
                "cold block %s holds other tokens than its key says; treated as a miss", key
            )
            return None
        if not store:
            return payload
        meta = BlockMeta(
            key=key,
            parent_key=parent,
            namespace=self.namespace.digest,
            token_count=len(block_tokens),
            computed_by=computed_by,
        )
        self._hot.put(meta, block_tokens, payload, self._codec.nbytes(payload), reused=True)
        self._known.remember(key)
        return payload

    def _record_hit(
        self,
        n_tokens: int,
        keys: list[str],
        payloads: list[Any],
        hot_hits: int,
        cold_hits: int,
        partial: int,
        point: FoundPoint | None = None,
        matched: int = 0,
    ) -> PrefixHit:
        cached = (hot_hits + cold_hits) * self.block_size + partial
        lease_keys = list(keys) + (list(point.keys) if point is not None else [])
        self._tally.add(
            lookups=1,
            lookup_tokens=n_tokens,
            hit_tokens=cached,
            hot_hits=hot_hits,
            cold_hits=cold_hits,
            partial_hits=1 if partial else 0,
            partial_tokens=partial,
            lost_tokens=max(matched - cached, 0) if point is not None else 0,
        )
        lease = 0
        if lease_keys:
            with self._lock:
                lease = next(self._lease_ids)
                self._leases[lease] = tuple(lease_keys)
            self._tally.set(last_hit_at=self._clock.now())
        return PrefixHit(
            tuple(keys),
            tuple(payloads),
            cached,
            hot_hits,
            cold_hits,
            lease,
            partial,
            windows=point.windows if point is not None else (),
            state=point.state if point is not None else None,
            matched=max(matched, cached),
        )
