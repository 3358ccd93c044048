"""The prefix cache: longest cached prefix of a prompt, and storing a finished request's blocks.

The engine calls it on its own thread; only ``stats()`` is read from others.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omlx.domain.blocks import BlockMeta, NamespaceInfo
from omlx.domain.hot_tier import HotTier
from omlx.domain.keys import block_key, chain_keys
from omlx.domain.ports import Clock, ColdSource, KVCodec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, eq=False)
class PrefixHit:
    """The matched leading blocks of one prompt, pinned until ``PrefixCache.release``."""

    keys: tuple[str, ...]
    payloads: tuple[Any, ...]
    cached_tokens: int
    hot_hits: int
    cold_hits: int
    lease: int = 0  # 0: nothing pinned

    @property
    def n_blocks(self) -> int:
        return len(self.keys)


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
    ) -> None:
        self.namespace = namespace
        self.block_size = namespace.block_size
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

    @property
    def hot(self) -> HotTier:
        return self._hot

    def is_pinned(self, key: str) -> bool:
        """Whether a running request holds ``key``; the cold tier's eviction asks this."""
        return self._hot.is_pinned(key)

    def lookup(self, tokens: Sequence[int]) -> PrefixHit:
        """The longest run of leading blocks held in RAM or on disk, pinned for this request.

        Never the whole prompt: at least one token is left to prefill, so the engine
        always has logits to sample from.
        """
        bs = self.block_size
        max_blocks = max((len(tokens) - 1) // bs, 0)
        keys: list[str] = []
        payloads: list[Any] = []
        hot_keys: list[str] = []
        cold_hits = 0
        parent = self.namespace.digest
        # Keys are chained lazily (same values as ``chain_keys``): a miss ends the walk.
        try:
            for i in range(max_blocks):
                block_tokens = tuple(tokens[i * bs : (i + 1) * bs])
                key = block_key(parent, block_tokens)
                block = self._hot.get(key)
                if block is not None:
                    payload = block.payload
                    hot_keys.append(key)
                else:
                    payload = self._from_cold(key, parent, block_tokens)
                    if payload is None:
                        break
                    cold_hits += 1
                # Pin as we go: promoting a later cold block must not evict an earlier match.
                self._hot.pin((key,))
                keys.append(key)
                payloads.append(payload)
                parent = key
        except BaseException:
            self._hot.unpin(keys)  # no lease was handed out: do not leak the pins
            raise
        if self._cold is not None and hot_keys:
            self._cold.touch(hot_keys)  # served from RAM: keep them young on disk too
        return self._record_hit(len(tokens), keys, payloads, len(hot_keys), cold_hits)

    def restore(self, hit: PrefixHit) -> Any:
        """A fresh engine cache holding the hit's blocks, or None when nothing matched."""
        if not hit.payloads:
            return None
        return self._codec.assemble(list(hit.payloads))

    def release(self, hit: PrefixHit) -> None:
        """Unpin the hit's blocks; releasing twice is harmless."""
        with self._lock:
            keys = self._leases.pop(hit.lease, None)
        if keys:
            self._hot.unpin(keys)

    def store(self, tokens: Sequence[int], cache: Any) -> int:
        """Cut every full block of ``tokens`` not yet in RAM out of ``cache``; returns how many.

        ``tokens`` are exactly the positions ``cache`` holds (prompt and generated).
        Each new block goes to the hot tier and is queued once for the cold tier.
        """
        started = time.perf_counter()
        bs = self.block_size
        parent = self.namespace.digest
        new = queued = 0
        for i, key in enumerate(chain_keys(self.namespace.digest, tokens, bs)):
            if self._hot.touch(key):
                parent = key
                continue
            start = i * bs
            block_tokens = tuple(tokens[start : start + bs])
            meta = BlockMeta(
                key=key, parent_key=parent, namespace=self.namespace.digest, token_count=bs
            )
            payload = self._codec.split(cache, start, start + bs)
            # A block that does not fit in RAM still goes to disk.
            self._hot.put(meta, block_tokens, payload, self._codec.nbytes(payload))
            new += 1
            if self._cold is not None and not self._is_known(key):
                if not self._cold.contains(key):
                    self._cold.put(
                        meta, block_tokens, self._codec.encode(payload, block_tokens, meta)
                    )
                    queued += 1
                self._remember(key)
            parent = key
        elapsed = time.perf_counter() - started
        with self._lock:
            self._stored += new
            self._queued += queued
            self._store_calls += 1
            self._store_seconds += elapsed
            self._last_store_seconds = elapsed
        return new

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
            )

    def _from_cold(self, key: str, parent: str, block_tokens: tuple[int, ...]) -> Any | None:
        """Read a block from the cold source and promote it into RAM; None on a miss."""
        if self._cold is None:
            return None
        try:
            found = self._cold.get(key, parent)
        except OSError:
            # The port promises not to raise; a disk error must still never fail a request.
            log.exception("cold tier read of %s failed; treated as a miss", key)
            return None
        if found is None:
            return None
        stored_tokens, payload = found
        if tuple(stored_tokens) != block_tokens:
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
        self, n_tokens: int, keys: list[str], payloads: list[Any], hot_hits: int, cold_hits: int
    ) -> PrefixHit:
        cached = len(keys) * self.block_size
        with self._lock:
            self._lookups += 1
            self._lookup_tokens += n_tokens
            self._hit_tokens += cached
            self._hot_hits += hot_hits
            self._cold_hits += cold_hits
            lease = 0
            if keys:
                lease = next(self._lease_ids)
                self._leases[lease] = tuple(keys)
                self._last_hit_at = self._clock.now()
        return PrefixHit(tuple(keys), tuple(payloads), cached, hot_hits, cold_hits, lease)

    def _is_known(self, key: str) -> bool:
        return key in self._known

    def _remember(self, key: str) -> None:
        self._known[key] = None
        self._known.move_to_end(key)
        while len(self._known) > self._known_limit:
            self._known.popitem(last=False)
