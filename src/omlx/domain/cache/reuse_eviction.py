"""The hot tier's default eviction order: one-off blocks first, reused conversations last.

Plain LRU lets a sub-agent or a burst of side calls push an agent's main session out of
RAM: the main session's blocks are the oldest touched while the others run, so they go
first, and the next main turn reads them back from disk. Here every block has a *reuse
level*: 0 when written, one up each time a later request matches it (capped), and a
new block starts at its parent's level, so the tail a conversation adds inherits the
standing of the prefix it extends while a side call's fresh chain starts at 0.
Victims: level 0 (one-off) in LRU order, then blocks left unused for several turnovers of
the tier (so a stale conversation cannot squat forever), then each level up, LRU within.
Two conversations reused equally often are told apart by recency alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

MAX_LEVEL = 3
STALE_TURNOVERS = 4  # unused while this many tier-fulls of accesses passed: stale


class ReuseLevelPolicy:
    """Segmented LRU by reuse level (implements ``EvictionPolicy``); O(1) per access."""

    def __init__(self, max_level: int = MAX_LEVEL, stale_turnovers: int = STALE_TURNOVERS) -> None:
        self._levels: list[OrderedDict[str, int]] = [OrderedDict() for _ in range(max_level + 1)]
        self._level_of: dict[str, int] = {}
        self._seen_at: dict[str, int] = {}  # key -> access tick of its last insert or hit
        self._tick = 0
        self._stale_turnovers = stale_turnovers

    def record_insert(self, key: str, nbytes: int, parent_key: str | None) -> None:
        """A new block: it inherits its parent's level (a conversation's new tail), else 0."""
        if key in self._level_of:
            self.record_access(key, nbytes)
            return
        level = self._level_of.get(parent_key, 0) if parent_key is not None else 0
        self._place(key, nbytes, level)

    def record_hit(self, key: str, nbytes: int) -> None:
        """A later request matched ``key``: one level up."""
        level = min(self._level_of.get(key, -1) + 1, len(self._levels) - 1)
        self._place(key, nbytes, level)

    def record_promotion(self, key: str, nbytes: int, parent_key: str | None) -> None:
        """``key`` read back from disk for a request that matched it: reused, at least level 1.

        Its history left with it, so it takes its parent's level (or 1), never one above:
        a chain read back block by block must not climb a level per block.
        """
        level = max(self._level_of.get(parent_key, 0) if parent_key is not None else 0, 1)
        self._place(key, nbytes, min(level, len(self._levels) - 1))

    def record_prefetch(self, key: str, nbytes: int, parent_key: str | None) -> None:
        """``key`` read back at start (warm restart), ahead of any request: level 0, at its
        oldest end, so it goes before every block a request touched; a request matching it
        lifts it as any hit does."""
        level = 0
        lru = self._levels[level]
        oldest = next(iter(lru), None)
        self.remove(key)
        lru[key] = nbytes
        lru.move_to_end(key, last=False)
        self._level_of[key] = level
        # Ticks rise along each level's order (``choose_victims`` stops at the first fresh one).
        self._seen_at[key] = self._seen_at[oldest] if oldest is not None else self._tick

    def record_access(self, key: str, nbytes: int) -> None:
        """Used again without being matched (same request re-storing it): recency only."""
        self._place(key, nbytes, self._level_of.get(key, 0))

    def remove(self, key: str) -> None:
        level = self._level_of.pop(key, None)
        if level is not None:
            self._levels[level].pop(key, None)
            self._seen_at.pop(key, None)

    def level(self, key: str) -> int | None:
        return self._level_of.get(key)

    def one_off_victims(
        self, bytes_to_free: int, is_pinned: Callable[[str], bool]
    ) -> tuple[list[str], int]:
        """``choose_victims`` among level-0 blocks only (never matched by a later request),
        and the bytes they free."""
        victims: list[str] = []
        freed = 0
        for key, nbytes in self._levels[0].items():
            if freed >= bytes_to_free:
                break
            if not is_pinned(key):
                victims.append(key)
                freed += nbytes
        return victims, freed

    def promotion_victims(
        self, key: str, bytes_to_free: int, is_pinned: Callable[[str], bool]
    ) -> list[str] | None:
        return self.choose_victims(bytes_to_free, is_pinned)  # every block read back enters

    def choose_victims(self, bytes_to_free: int, is_pinned: Callable[[str], bool]) -> list[str]:
        victims: list[str] = []
        chosen: set[str] = set()
        freed = 0
        stale_before = self._tick - self._stale_turnovers * max(len(self._level_of), 1)

        def take(key: str, nbytes: int) -> bool:
            nonlocal freed
            if freed >= bytes_to_free:
                return False
            if key not in chosen and not is_pinned(key):
                victims.append(key)
                chosen.add(key)
                freed += nbytes
            return True

        for key, nbytes in self._levels[0].items():
            if not take(key, nbytes):
                return victims
        for level in self._levels[1:]:
            for key, nbytes in level.items():  # oldest first: stop at the first fresh one
                if self._seen_at[key] >= stale_before or not take(key, nbytes):
                    break
        for level in self._levels[1:]:
            for key, nbytes in level.items():
                if not take(key, nbytes):
                    return victims
        return victims

    def __len__(self) -> int:
        return len(self._level_of)

    def __contains__(self, key: object) -> bool:
        return key in self._level_of

    def _place(self, key: str, nbytes: int, level: int) -> None:
        old = self._level_of.get(key)
        if old is not None and old != level:
            self._levels[old].pop(key, None)
        self._levels[level][key] = nbytes
        self._levels[level].move_to_end(key)
        self._level_of[key] = level
        self._tick += 1
        self._seen_at[key] = self._tick
