"""The hot tier: a RAM pool of blocks under a byte budget; unpinned blocks leave in its
policy's order (LRU here; the server passes ``ProbationPolicy``: one-off blocks first, and
a block read back from disk enters only where it displaces no resident until it recurs).

Full and partial blocks alike (see ``keys``): the same budget, eviction order and pins. A
parent -> children map lets token-granular matching find every block that extends a
matched prefix. The engine thread mutates it; other threads (``/health``) read
``stats()``, and warm restart's prefetch thread adds blocks into free room only
(``fill``); one lock, never held across a file read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.eviction import LRUPolicy
from omlx.domain.cache.keys import KV
from omlx.domain.cache.ports import EvictionPolicy

# What ``HotTier.fill`` did with a prefetched block.
ADDED, HELD, FULL = "added", "held", "full"


@dataclass(frozen=True, slots=True)
class HotBlock:
    """One block held in RAM: the codec's payload and what it covers."""

    meta: BlockMeta
    tokens: tuple[int, ...]
    payload: Any
    nbytes: int

    @property
    def key(self) -> str:
        return self.meta.key


@dataclass(frozen=True, slots=True)
class HotTierStats:
    """A snapshot of the hot tier for metrics and ``/health``."""

    blocks: int
    bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int
    pinned: int  # keys with a live pin, held in RAM or not


class HotTier:
    """Blocks in RAM; ``bytes <= max_bytes`` always, pinned blocks are never evicted.

    Pins are counted per key and independent of presence: a request pins every key it
    matched, so the cold tier can ask ``is_pinned`` for blocks that left RAM too.
    """

    def __init__(self, max_bytes: int, policy: EvictionPolicy | None = None) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._policy: EvictionPolicy = policy if policy is not None else LRUPolicy()
        self._blocks: dict[str, HotBlock] = {}
        self._children: dict[str, set[str]] = {}  # parent key -> KV blocks held in RAM
        self._points: dict[str, set[str]] = {}  # parent key -> restore-point objects in RAM
        self._pins: dict[str, int] = {}
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        # key -> tick of its last use, for ``recent`` (the hot set warm restart records).
        # Prefetched blocks get ticks below every request's, in prefetch order.
        self._used: dict[str, int] = {}
        self._tick = 0
        self._fill_tick = 0
        self._version = 0  # moves with requests' changes: the recorder writes when it moved
        self._lock = threading.Lock()

    def get(self, key: str, *, count: bool = True) -> HotBlock | None:
        """The block, marked most recently used (reused); counts a hit or a miss unless
        ``count`` is False (an object that is no prompt's block: an image's rows)."""
        with self._lock:
            block = self._blocks.get(key)
            if block is None:
                self._misses += count
                return None
            self._hits += count
            self._policy.record_hit(key, block.nbytes)
            self._mark_locked(key)
            return block

    def peek(self, key: str) -> HotBlock | None:
        """The block, or None; counts no hit, moves no LRU order (priming reads it)."""
        with self._lock:
            return self._blocks.get(key)

    def sizes(self, keys: Iterable[str]) -> dict[str, int]:
        """The bytes of those of ``keys`` held; counts no hit, moves no LRU order."""
        with self._lock:
            return {k: self._blocks[k].nbytes for k in keys if k in self._blocks}

    def children(self, parent_key: str) -> list[HotBlock]:
        """KV blocks in RAM whose parent is ``parent_key``; counts no hit, moves no LRU order."""
        with self._lock:
            return [self._blocks[k] for k in self._children.get(parent_key, ())]

    def point_children(self, parent_keys: Iterable[str]) -> list[HotBlock]:
        """Restore-point objects (state, window) in RAM hanging from any of ``parent_keys``."""
        with self._lock:
            return [self._blocks[k] for p in parent_keys for k in self._points.get(p, ())]

    def touch(self, key: str) -> bool:
        """Mark ``key`` most recently used without counting a hit; False when absent."""
        with self._lock:
            block = self._blocks.get(key)
            if block is None:
                return False
            self._policy.record_access(key, block.nbytes)
            self._mark_locked(key)
            return True

    def put(
        self,
        meta: BlockMeta,
        tokens: tuple[int, ...],
        payload: Any,
        nbytes: int,
        *,
        reused: bool = False,
    ) -> bool:
        """Store a block, evicting unpinned blocks (policy order) to make room; False when it cannot fit.

        A key already present is only touched (same key, same content). Nothing is evicted
        for a block that would not fit even after evicting every unpinned block.
        ``reused``: a block read back from disk for a request that matched it (a hit); the
        policy may decline it room (``promotion_victims``): False, RAM as it was. Not a
        block pinned already (a pinned prefix's): that one makes room as a new block does.
        """
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        with self._lock:
            if meta.key in self._blocks:
                self._policy.record_access(meta.key, self._blocks[meta.key].nbytes)
                self._mark_locked(meta.key)
                return True
            if nbytes > self.max_bytes:
                return False
            needed = self._bytes + nbytes - self.max_bytes
            if needed > 0:
                if reused and not self._is_pinned_locked(meta.key):
                    victims = self._policy.promotion_victims(
                        meta.key, needed, self._is_pinned_locked
                    )
                else:  # computed here, or pinned already (a pinned prefix): wanted in RAM
                    victims = self._policy.choose_victims(needed, self._is_pinned_locked)
                if victims is None or sum(self._blocks[k].nbytes for k in victims) < needed:
                    return False
                for victim in victims:
                    self._evict_locked(victim)
            self._add_locked(meta, tokens, payload, nbytes)
            if reused:
                self._policy.record_promotion(meta.key, nbytes, meta.parent_key)
            else:
                self._policy.record_insert(meta.key, nbytes, meta.parent_key)
            self._mark_locked(meta.key)
            return True

    def fill(self, meta: BlockMeta, tokens: tuple[int, ...], payload: Any, nbytes: int) -> str:
        """Add a block read ahead of any request (warm restart) into free room only.

        Nothing is evicted for it and a block already held is left as it is (not even
        touched); it ranks behind every block a request used (``record_prefetch``), so it
        is the first to go when a request needs room. ``ADDED``, ``HELD`` or ``FULL``.
        """
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        with self._lock:
            if meta.key in self._blocks:
                return HELD
            if self._bytes + nbytes > self.max_bytes:
                return FULL
            self._add_locked(meta, tokens, payload, nbytes)
            self._policy.record_prefetch(meta.key, nbytes, meta.parent_key)
            self._fill_tick -= 1
            self._used[meta.key] = self._fill_tick
            return ADDED

    def free_bytes(self) -> int:
        """Room left under the budget without evicting anything."""
        with self._lock:
            return max(self.max_bytes - self._bytes, 0)

    def recent(self) -> list[HotBlock]:
        """The blocks held, most recently used first (prefetched ones last, in their order)."""
        with self._lock:
            order = sorted(self._blocks, key=self._used.__getitem__, reverse=True)
            return [self._blocks[k] for k in order]

    @property
    def version(self) -> int:
        """A number that moves whenever requests change what is held or its order (a
        prefetch's ``fill`` does not move it: it only restores what was recorded)."""
        with self._lock:
            return self._version

    def pin(self, keys: Iterable[str]) -> None:
        """Protect ``keys`` from eviction until as many ``unpin`` calls."""
        with self._lock:
            for key in keys:
                self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, keys: Iterable[str]) -> None:
        """Drop one pin per key; a key without pins is ignored."""
        with self._lock:
            for key in keys:
                count = self._pins.get(key, 0)
                if count <= 1:
                    self._pins.pop(key, None)
                else:
                    self._pins[key] = count - 1

    def is_pinned(self, key: str) -> bool:
        with self._lock:
            return self._is_pinned_locked(key)

    def shrink(self, target_bytes: int) -> int:
        """Evict unpinned blocks (policy order) until ``bytes <= target_bytes`` (or none is left); bytes freed."""
        with self._lock:
            needed = self._bytes - max(target_bytes, 0)
            if needed <= 0:
                return 0
            before = self._bytes
            for victim in self._policy.choose_victims(needed, self._is_pinned_locked):
                self._evict_locked(victim)
            return before - self._bytes

    def discard(self, keys: Iterable[str]) -> int:
        """Drop ``keys`` (pinned or not: their payloads proved unusable); how many were held."""
        with self._lock:
            held = [k for k in keys if k in self._blocks]
            for key in held:
                self._evict_locked(key)
                self._evictions -= 1  # not an eviction for room
            return len(held)

    def clear(self) -> None:
        """Drop every block (pinned ones too: their requests hold the payloads); keep pins and counters."""
        with self._lock:
            for key in self._blocks:
                self._policy.remove(key)
            self._blocks.clear()
            self._children.clear()
            self._points.clear()
            self._used.clear()
            self._bytes = 0
            self._version += 1

    def stats(self) -> HotTierStats:
        with self._lock:
            return HotTierStats(
                blocks=len(self._blocks),
                bytes=self._bytes,
                max_bytes=self.max_bytes,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                pinned=len(self._pins),
            )

    def keys(self) -> list[str]:
        """A snapshot of the keys held in RAM, in no particular order."""
        with self._lock:
            return list(self._blocks)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._blocks

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    def _is_pinned_locked(self, key: str) -> bool:
        return key in self._pins

    def _add_locked(
        self, meta: BlockMeta, tokens: tuple[int, ...], payload: Any, nbytes: int
    ) -> None:
        self._blocks[meta.key] = HotBlock(meta, tokens, payload, nbytes)
        # Restore-point objects are no blocks to match a prompt against: a map of their own.
        children = self._children if meta.kind == KV else self._points
        children.setdefault(meta.parent_key, set()).add(meta.key)
        self._bytes += nbytes

    def _mark_locked(self, key: str) -> None:
        self._tick += 1
        self._used[key] = self._tick
        self._version += 1

    def _evict_locked(self, key: str) -> None:
        block = self._blocks.pop(key)
        self._used.pop(key, None)
        self._version += 1
        children = self._children if block.meta.kind == KV else self._points
        siblings = children.get(block.meta.parent_key)
        if siblings is not None:
            siblings.discard(key)
            if not siblings:
                del children[block.meta.parent_key]
        self._policy.remove(key)
        self._bytes -= block.nbytes
        self._evictions += 1
