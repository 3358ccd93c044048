"""The prefix cache: what a model's engine holds of the block cache (DESIGN §2).

A small facade over its parts: ``PrefixMatcher`` (lookup, leases), ``BlockKeeper``
(write-through), ``RequestCapture`` (cutting a running request's blocks) and the kept
finished caches (``KeptCaches``). The engine starts one ``CacheSession`` per request
with ``begin`` and otherwise only asks for memory back; every call runs on the engine
thread except ``stats``, ``held_bytes``, ``is_pinned``, ``probe`` (what a prompt would
restore, for diagnostics) and ``pins`` (pinned prefixes), which others use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omlx.domain.cache.blocks import NamespaceInfo
from omlx.domain.cache.capture import RequestCapture
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keeper import BlockKeeper, KnownKeys
from omlx.domain.cache.keys import tenant_root
from omlx.domain.cache.layout import CacheLayout
from omlx.domain.cache.matcher import PrefixMatcher
from omlx.domain.cache.pins import DEFAULT_PIN_SHARE, PinBook
from omlx.domain.cache.ports import ColdSource, KeptCaches, KVCodec
from omlx.domain.cache.prime import prime
from omlx.domain.cache.probe import CachedPrefix, probe
from omlx.domain.cache.session import CacheSession
from omlx.domain.cache.tally import PrefixCacheStats, Tally, TenantTally
from omlx.domain.ports import Clock, SystemClock


class PrefixCache:
    """Matches prompts against the hot tier, then the cold source; keeps new blocks write-through."""

    def __init__(
        self,
        *,
        namespace: NamespaceInfo,
        codec: KVCodec,
        hot: HotTier,
        cold: ColdSource | None = None,
        clock: Clock | None = None,
        known_keys_limit: int = 1 << 16,
        deferred_limit: int = 1 << 16,
        layout: CacheLayout | None = None,
        kept: KeptCaches | None = None,
        pin_share: float = DEFAULT_PIN_SHARE,
        block_bytes: int = 0,
        server_id: str = "",
    ) -> None:
        """``server_id``: this server's name among those sharing a cold tier, recorded with
        every block it computes ("": none recorded; a library's cache)."""
        self.namespace = namespace
        self.block_size = namespace.block_size
        self.layout = layout if layout is not None else CacheLayout()
        self._codec, self._hot, self._kept, self._cold = codec, hot, kept, cold
        self._tally = Tally()
        clock = self._clock = clock if clock is not None else SystemClock()
        self.tenants = TenantTally()
        self.pins = PinBook(
            hot,
            clock,
            namespace=namespace.digest,
            block_size=self.block_size,
            share=pin_share,
            block_bytes=block_bytes,  # what a pin costs before its blocks are in RAM
        )
        known = self._known = KnownKeys(known_keys_limit)
        self._matcher = PrefixMatcher(
            namespace=namespace,
            codec=codec,
            hot=hot,
            cold=cold,
            layout=self.layout,
            known=known,
            tally=self._tally,
            clock=clock,
            server_id=server_id,
        )
        self._keeper = BlockKeeper(
            namespace=namespace,
            codec=codec,
            hot=hot,
            cold=cold,
            known=known,
            tally=self._tally,
            server_id=server_id,
            deferred_limit=deferred_limit,  # keys waiting for room in the writer's queue
        )

    def begin(
        self,
        prompt: Sequence[int],
        *,
        store: bool = True,
        tenant: str | None = None,
        probed: CachedPrefix | None = None,
    ) -> CacheSession:
        """One request's session: its prompt looked up now (the prefix pinned), never raising.

        ``store=False``: a no-store request, which restores and keeps nothing. ``tenant``:
        the API key's tenant, whose blocks are keyed from its own root (``tenant_root``).
        ``probed``: what ``probe`` found of this prompt when the request was prepared; its
        keys and index rows are reused, so a request hashes its prompt and asks once.
        """
        self.pins.expire()
        session = CacheSession(
            prompt,
            matcher=self._matcher,
            keeper=self._keeper,
            codec=self._codec,
            layout=self.layout,
            kept=self._kept,
            tally=self._tally,
            store=store,
            root=self.root_of(tenant),
            chain=probed.chain if probed is not None else None,
        )
        self.tenants.looked_up(tenant or "", len(prompt), session.cached_tokens)
        return session

    def root_of(self, tenant: str | None) -> str | None:
        """The chain root of ``tenant``'s blocks; None (the namespace's) for the default one."""
        return tenant_root(self.namespace.digest, tenant) if tenant else None

    def probe(self, tokens: Sequence[int], tenant: str | None = None) -> CachedPrefix:
        """How much of ``tokens`` the tiers hold now, changing nothing (any thread)."""
        return probe(
            tokens,
            namespace=self.root_of(tenant) or self.namespace.digest,
            block_size=self.block_size,
            hot=self._hot,
            cold=self._cold,
            clock=self._clock.now,
        )

    @property
    def hot(self) -> HotTier:
        """The hot tier (warm restart records its hot set and fills it at start)."""
        return self._hot

    @property
    def codec(self) -> KVCodec:
        return self._codec

    @property
    def cold(self) -> ColdSource | None:
        """The cold source (export and import read and queue blocks through it)."""
        return self._cold

    def held_blocks(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, from the first, RAM or disk holds now (a pin's state; any thread)."""
        n = 0
        while n < len(keys) and keys[n] in self._hot:
            n += 1
        if n < len(keys) and self._cold is not None:
            on_disk = self._cold.present(list(keys[n:]))
            while n < len(keys) and keys[n] in on_disk:
                n += 1
        return n

    def make_room(self, room: int, session: CacheSession | None = None) -> int:
        """Give RAM back until this cache holds at most ``room`` bytes; the bytes it still holds.

        ``session``: the request asking. The kept finished cache it will continue is its
        own cache from then on, which the room it asked for already counts: that one is
        neither counted here nor dropped. Nothing goes while the rest fits (the engine asks
        at every admission). Past ``room``, the other kept caches go first, oldest first
        (the hot tier holds their blocks too), then the hot tier's blocks in its policy's
        order, pinned ones never (a request pins its prefix by its ``begin``, before asking).
        """
        spare = session.kept_prefix() if session is not None and self._kept is not None else ()
        own = self._kept.held_for(spare) if self._kept is not None and spare else 0
        if self.held_bytes() - own <= room:
            return self.held_bytes() - own
        if self._kept is not None:
            self._kept.shrink(max(room - self._hot.stats().bytes, 0), spare)
        self._hot.shrink(room - (self._kept_bytes() - own))
        return self.held_bytes() - own

    def prime(self, keys: Sequence[str]) -> str:
        """Join the chain ``keys`` from RAM into a kept cache, as its finished request kept
        it (warm restart, on the engine thread while idle; ``prime.prime``); what it did."""
        return prime(
            keys,
            hot=self._hot,
            codec=self._codec,
            kept=self._kept,
            layout=self.layout,
            block_size=self.block_size,
        )

    def drop_kept(self) -> None:
        """Forget the kept finished caches (the engine was reset)."""
        if self._kept is not None:
            self._kept.clear()

    def held_bytes(self) -> int:
        """Bytes of KV this cache holds in RAM: the hot tier and the kept finished caches."""
        return self._hot.stats().bytes + self._kept_bytes()

    def _kept_bytes(self) -> int:
        return self._kept.nbytes if self._kept is not None else 0

    def clear(self) -> int:
        """Drop every block in RAM and forget which are on disk; the blocks dropped.

        For an admin clearing this model's blocks on disk too (the dashboard): the next
        request computes its prompt afresh and queues its blocks for disk again. Safe
        beside the engine thread (the hot tier locks; the known keys are swapped).
        """
        dropped = self._hot.stats().blocks
        self._hot.clear()
        self._known.forget()
        return dropped

    def forget_stored(self) -> None:
        """Forget which blocks are on disk (a vacuum evicted some there), so they are queued again."""
        self._known.forget()

    def write_deferred(self) -> int:
        """Queue for disk the blocks in RAM the writer had no room for (engine thread: the
        engine asks when idle and at its stop); how many were queued."""
        return self._keeper.write_deferred()

    def is_pinned(self, key: str) -> bool:
        """Whether a running request holds ``key``; the cold tier's eviction asks this."""
        return self._hot.is_pinned(key)

    def store(self, tokens: Sequence[int], cache: Any) -> int:
        """Keep every block of a cache no request looked up (tests); how many were new."""
        capture = RequestCapture(self._keeper, self._codec, self.layout, tokens)
        capture.finished(tokens, cache)
        return capture.stored_blocks

    def stats(self) -> PrefixCacheStats:
        return self._tally.read_as(
            PrefixCacheStats,
            active_leases=self._matcher.active_leases,
            hit_tokens_by=self._matcher.restored.read(),
            kept_bytes=self._kept.nbytes if self._kept is not None else 0,
            hot=self._hot.stats(),
        )
