"""The prefix cache: longest cached prefix of a prompt, and storing a finished request's blocks.

Matching is token-granular without changing the key contract (``keys``): whole blocks
are matched by key as before; where that walk stops, every stored child of the last
matched key (a full block with another tail, or a request's trailing partial block)
serves its leading tokens that equal the prompt's, since KV at position ``j`` depends
only on tokens ``<= j``. So a follow-up turn or a replay recomputes its new tokens, not
up to ``block_size - 1`` more. The engine calls it on its own thread; only ``stats()``
is read from others.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from omlx.domain.blocks import BlockMeta, NamespaceInfo
from omlx.domain.capture import RequestCapture
from omlx.domain.hot_tier import HotTier
from omlx.domain.keys import block_key, chain_keys, object_key
from omlx.domain.layout import CacheLayout
from omlx.domain.partial_match import PartialMatch, best_child
from omlx.domain.point_finder import FoundPoint, RestorePointFinder
from omlx.domain.ports import Clock, ColdSource, KVCodec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, eq=False)
class PrefixHit:
    """The matched prefix of one prompt, pinned until ``PrefixCache.release``.

    ``keys``/``payloads``: the whole blocks matched by key, then, when ``partial_tokens``
    is non-zero, the block whose first ``partial_tokens`` positions continue them (its
    payload already truncated). ``hot_hits``/``cold_hits`` count whole blocks only.
    """

    keys: tuple[str, ...]
    payloads: tuple[Any, ...]
    cached_tokens: int
    hot_hits: int
    cold_hits: int
    lease: int = 0  # 0: nothing pinned
    partial_tokens: int = 0
    # Hybrid and sliding-window layouts: the restore point's window objects (in position
    # order) and state snapshot, and how far the KV chain reached before it.
    windows: tuple[Any, ...] = ()
    state: Any = None
    matched: int = 0

    @property
    def lost_tokens(self) -> int:
        """Positions the KV chain matched past the deepest restore point (recomputed)."""
        return max(self.matched - self.cached_tokens, 0)

    @property
    def n_blocks(self) -> int:
        """Whole blocks matched by key (the partially used block not counted)."""
        return len(self.keys) - (1 if self.partial_tokens else 0)


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Cumulative counters of one prefix cache, for metrics and ``/health``."""

    lookups: int
    lookup_tokens: int
    hit_tokens: int
    hot_hits: int
    cold_hits: int
    stored_blocks: int
    queued_blocks: int
    active_leases: int
    last_hit_at: float | None
    # Time the request path spent cutting and encoding new blocks (engine thread).
    store_calls: int = 0
    store_seconds: float = 0.0
    last_store_seconds: float = 0.0
    # Lookups that used part of a block, and the tokens those parts restored.
    partial_hits: int = 0
    partial_tokens: int = 0
    # Hybrid layouts: KV-matched tokens recomputed for want of a restore point there,
    # and the state and window objects stored and their bytes.
    lost_tokens: int = 0
    stored_objects: int = 0
    object_bytes: int = 0


class _SystemClock:
    def now(self) -> float:
        return time.time()


class PrefixCache:
    """Matches prompts against the hot tier, then the cold source; stores new blocks write-through."""

    def __init__(
        self,
        *,
        namespace: NamespaceInfo,
        codec: KVCodec,
        hot: HotTier,
        cold: ColdSource | None = None,
        clock: Clock | None = None,
        known_keys_limit: int = 1 << 16,
        layout: CacheLayout | None = None,
    ) -> None:
        self.namespace = namespace
        self.block_size = namespace.block_size
        self.layout = layout if layout is not None else CacheLayout()
        self._codec = codec
        self._hot = hot
        self._cold = cold
        self._clock: Clock = clock if clock is not None else _SystemClock()
        # Keys queued for (or read from) the cold tier: skips re-encoding on repeated
        # stores. Bounded; a forgotten key falls back to ``cold.contains``.
        self._known: OrderedDict[str, None] = OrderedDict()
        self._known_limit = known_keys_limit
        self._leases: dict[int, tuple[str, ...]] = {}
        self._lease_ids = itertools.count(1)
        self._lock = threading.Lock()  # counters and leases, for readers on other threads
        self._lookups = 0
        self._lookup_tokens = 0
        self._hit_tokens = 0
        self._hot_hits = 0
        self._cold_hits = 0
        self._stored = 0
        self._queued = 0
        self._last_hit_at: float | None = None
        self._store_calls = 0
        self._store_seconds = 0.0
        self._last_store_seconds = 0.0
        self._partial_hits = 0
        self._partial_tokens = 0
        self._lost_tokens = 0
        self._stored_objects = 0
        self._object_bytes = 0
        self._points = RestorePointFinder(
            namespace=namespace.digest,
            block_size=self.block_size,
            layout=self.layout,
            codec=codec,
            hot=hot,
            cold=cold,
            read_cold=self._read_cold,
            remember=self._remember,
        )

    @property
    def hot(self) -> HotTier:
        return self._hot

    @property
    def codec(self) -> KVCodec:
        return self._codec

    def hot_bytes(self) -> int:
        """Bytes the hot tier holds now (KV in RAM, counted by the memory guard)."""
        return self._hot.stats().bytes

    def make_room(self, room: int) -> int:
        """Give RAM back until the hot tier holds at most ``room`` bytes; the bytes it still holds.

        Least recently used first, pinned blocks never (pin a request's prefix by looking it
        up before asking room for it).
        """
        self._hot.shrink(room)
        return self._hot.stats().bytes

    def forget_stored(self) -> None:
        """Stop assuming keys queued earlier are on disk (an admin removed blocks there).

        The set is swapped, not cleared: the engine thread may be using the old one.
        """
        self._known = OrderedDict()

    def is_pinned(self, key: str) -> bool:
        """Whether a running request holds ``key``; the cold tier's eviction asks this."""
        return self._hot.is_pinned(key)

    def lookup(self, tokens: Sequence[int]) -> PrefixHit:
        """The longest cached prefix of ``tokens``, to the token, pinned for this request.

        Whole blocks first (by key, RAM then disk), then the best child of the last
        matched key. Never the whole prompt: at least one token is left to prefill, so
        the engine always has logits to sample from.
        """
        bs = self.block_size
        max_blocks = max((len(tokens) - 1) // bs, 0)
        keys: list[str] = []
        payloads: list[Any] = []
        hot_keys: list[str] = []
        cold_hits = 0
        partial = 0
        parent = self.namespace.digest
        try:
            # RAM, block by block (keys chained lazily, as ``chain_keys``) to its first miss.
            for i in range(max_blocks):
                key = block_key(parent, tokens[i * bs : (i + 1) * bs])
                block = self._hot.get(key)
                if block is None:
                    break
                self._take(key, block.payload, keys, payloads)
                hot_keys.append(key)
                parent = key
            if len(keys) < max_blocks and self._cold is not None:
                cold_hits = self._walk_cold(tokens, max_blocks, parent, keys, payloads, hot_keys)
                parent = keys[-1] if keys else parent
            n_hot = len(hot_keys)
            match = self._best_child(tokens, len(keys) * bs, parent)
            if match is not None:
                partial = match.shared
                payloads.append(self._codec.truncate(match.payload, partial))
                self._hot.pin((match.meta.key,))
                keys.append(match.meta.key)
                if match.from_hot:
                    hot_keys.append(match.meta.key)
            n_full = len(keys) - (1 if match is not None else 0)
            point = None
            if not self.layout.plain:
                point = self._points.find(tokens, keys[:n_full], n_full * self.block_size + partial)
                keys, payloads, partial, n_hot, cold_hits = self._points.clamp(
                    point, keys, payloads, partial, n_hot, cold_hits
                )
        except BaseException:
            self._hot.unpin(keys)  # no lease was handed out: do not leak the pins
            raise
        if self._cold is not None and hot_keys:
            self._cold.touch(hot_keys)  # served from RAM: keep them young on disk too
        matched = n_full * self.block_size + (match.shared if match is not None else 0)
        return self._record_hit(len(tokens), keys, payloads, n_hot, cold_hits, partial, point, matched)

    def restore(self, hit: PrefixHit) -> Any:
        """A fresh engine cache holding the hit's blocks, or None when nothing matched."""
        if not hit.payloads:
            return None
        if self.layout.plain:
            return self._codec.assemble(list(hit.payloads))
        return self._codec.assemble(list(hit.payloads), windows=list(hit.windows), state=hit.state)

    def capture(self, prompt: Sequence[int], hit: PrefixHit | None = None) -> RequestCapture:
        """What keeps a request's computed KV and restore points as the engine computes them."""
        return RequestCapture(self, prompt, hit)

    def holds(self, key: str) -> bool:
        """Whether ``key`` is in RAM (touched: a request is using it again)."""
        return self._hot.touch(key)

    def put_kv(self, key: str, parent: str, tokens: Sequence[int], payload: Any) -> int:
        """Keep one KV block (full or a request's trailing partial one): RAM, then disk. 1 if new."""
        if self._hot.touch(key):
            return 0
        meta = BlockMeta(key=key, parent_key=parent, namespace=self.namespace.digest, token_count=len(tokens))
        self._keep(meta, tuple(tokens), payload)
        with self._lock:
            self._stored += 1
        return 1

    def put_object(self, kind: str, anchor: str, parent: str, tokens: Sequence[int], payload: Any) -> None:
        """Keep a restore point's window or state object of ``anchor`` (block_key(parent, tokens))."""
        key = object_key(kind, anchor)
        if self._hot.touch(key):
            return
        meta = BlockMeta(
            key=key, parent_key=parent, namespace=self.namespace.digest, token_count=len(tokens), kind=kind
        )
        self._keep(meta, tuple(tokens), payload)
        with self._lock:
            self._stored_objects += 1
            self._object_bytes += self._codec.nbytes(payload)

    def record_store(self, seconds: float) -> None:
        """Engine-thread time spent keeping a request's blocks (for stats and benchmarks)."""
        with self._lock:
            self._store_calls += 1
            self._store_seconds += seconds
            self._last_store_seconds = seconds

    def release(self, hit: PrefixHit) -> None:
        """Unpin the hit's blocks; releasing twice is harmless."""
        with self._lock:
            keys = self._leases.pop(hit.lease, None)
        if keys:
            self._hot.unpin(keys)

    def store(self, tokens: Sequence[int], cache: Any) -> int:
        """Cut every block of ``tokens`` not yet in RAM out of ``cache``; returns how many.

        ``tokens`` are exactly the positions ``cache`` holds (prompt and generated). The
        full blocks, then the trailing partial block (if any), each keyed by the chained
        formula; each new block goes to the hot tier and is queued once for the cold tier;
        for hybrid layouts, the restore point at the end too.
        """
        started = time.perf_counter()
        capture = RequestCapture(self, tokens)
        capture.finished(tokens, cache)
        self.record_store(time.perf_counter() - started)
        return capture.stored_blocks

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return PrefixCacheStats(
                lookups=self._lookups,
                lookup_tokens=self._lookup_tokens,
                hit_tokens=self._hit_tokens,
                hot_hits=self._hot_hits,
                cold_hits=self._cold_hits,
                stored_blocks=self._stored,
                queued_blocks=self._queued,
                active_leases=len(self._leases),
                last_hit_at=self._last_hit_at,
                store_calls=self._store_calls,
                store_seconds=self._store_seconds,
                last_store_seconds=self._last_store_seconds,
                partial_hits=self._partial_hits,
                partial_tokens=self._partial_tokens,
                lost_tokens=self._lost_tokens,
                stored_objects=self._stored_objects,
                object_bytes=self._object_bytes,
            )

    def _keep(self, meta: BlockMeta, tokens: tuple[int, ...], payload: Any) -> None:
        """Put an object in RAM and queue it once for disk (write-through)."""
        # An object that does not fit in RAM still goes to disk.
        self._hot.put(meta, tokens, payload, self._codec.nbytes(payload))
        key = meta.key
        if self._cold is not None and not self._is_known(key):
            if not self._cold.contains(key):
                self._cold.put(meta, tokens, self._codec.encode(payload, tokens, meta))
                with self._lock:
                    self._queued += 1
            self._remember(key)

    def _best_child(self, tokens: Sequence[int], start: int, parent: str) -> PartialMatch | None:
        """The child of ``parent`` continuing ``tokens[start:]`` the furthest (promoted to RAM).

        Capped so one token is left to prefill; disk is asked only when RAM could be beaten.
        """
        want = tuple(tokens[start : start + max(min(len(tokens) - 1 - start, self.block_size), 0)])
        if not want:
            return None
        cold = self._cold
        match = best_child(
            want,
            self._hot.children(parent),
            (lambda: cold.children(parent)) if cold is not None else None,
            lambda meta: self._read_cold(meta.key, parent),
        )
        if match is None:
            return None
        if match.from_hot:
            self._hot.touch(match.meta.key)
        else:  # promoted whole: the next lookup finds it in RAM
            self._hot.put(
                match.meta, match.tokens, match.payload, self._codec.nbytes(match.payload)
            )
            self._remember(match.meta.key)
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
        hot_keys: list[str],
    ) -> int:
        """Extend the match past RAM's first miss; returns how many blocks came from disk.

        The rest of the chain is asked of the cold source in one batch (read ahead
        while this thread decodes); blocks RAM still holds are taken from RAM. The
        walk ends at the first block neither has.
        """
        assert self._cold is not None
        bs = self.block_size
        start = len(keys)
        rest = chain_keys(parent, tokens[start * bs : max_blocks * bs], bs)
        parents = [parent, *rest[:-1]]
        wanted = [(k, p) for k, p in zip(rest, parents, strict=True) if k not in self._hot]
        cold_hits = planned = 0
        with closing(self._cold.get_many(wanted)) as batch:
            for j, (key, parent_key) in enumerate(zip(rest, parents, strict=True)):
                block_tokens = tuple(tokens[(start + j) * bs : (start + j + 1) * bs])
                if planned < len(wanted) and wanted[planned][0] == key:
                    planned += 1
                    payload = self._promote(key, parent_key, block_tokens, self._next(batch, key))
                else:
                    block = self._hot.get(key)
                    if block is not None:
                        self._take(key, block.payload, keys, payloads)
                        hot_keys.append(key)
                        continue
                    # Left RAM since the batch was planned (a promotion evicted it).
                    found = self._read_cold(key, parent_key)
                    payload = self._promote(key, parent_key, block_tokens, found)
                if payload is None:
                    break
                self._take(key, payload, keys, payloads)
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

    def _read_cold(self, key: str, parent: str) -> tuple[tuple[int, ...], Any] | None:
        """A verified read from the cold source (checksum, rehash to ``key``); None on a miss."""
        assert self._cold is not None
        try:
            found = self._cold.get(key, parent)
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
    ) -> Any | None:
        """Put a block read from the cold source into RAM; its payload, or None on a miss."""
        if found is None:
            return None
        stored_tokens, payload = found
        if stored_tokens != block_tokens:
            log.warning(
                "cold block %s holds other tokens than its key says; treated as a miss", key
            )
            return None
        meta = BlockMeta(
            key=key,
            parent_key=parent,
            namespace=self.namespace.digest,
            token_count=len(block_tokens),
        )
        self._hot.put(meta, block_tokens, payload, self._codec.nbytes(payload))
        self._remember(key)
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
        with self._lock:
            self._lookups += 1
            self._lookup_tokens += n_tokens
            self._hit_tokens += cached
            self._hot_hits += hot_hits
            self._cold_hits += cold_hits
            if partial:
                self._partial_hits += 1
                self._partial_tokens += partial
            self._lost_tokens += max(matched - cached, 0) if point is not None else 0
            lease = 0
            if lease_keys:
                lease = next(self._lease_ids)
                self._leases[lease] = tuple(lease_keys)
                self._last_hit_at = self._clock.now()
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

    def _is_known(self, key: str) -> bool:
        return key in self._known

    def _remember(self, key: str) -> None:
        self._known[key] = None
        self._known.move_to_end(key)
        while len(self._known) > self._known_limit:
            self._known.popitem(last=False)
