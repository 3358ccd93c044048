"""The hot tier's default policy: blocks read back from disk earn their place in RAM.

Many conversations rotating through a RAM tier smaller than their working set defeat LRU,
and ``ReuseLevelPolicy`` alone too: each request reads its conversation's prefix back from
disk and copies it into RAM, which flushes the blocks the next conversations need, so
every later request reads from disk again (issue 38: 0 of 94,254 restored blocks came from
RAM, 12 conversations under a tier 1/7.4 of their working set). Here, as in S3-FIFO and 2Q,
a block read back from disk is a candidate, not a resident:

- it enters RAM only into room that costs no resident: free room, or the room of other
  candidates (*probation*, oldest first). Where that is not enough, copying it would only
  flush blocks a later request needs, and be flushed in turn: the request uses the payload
  it read (its key stays pinned) and RAM keeps what it held. (Letting it take one-off
  blocks' room as well lost every RAM hit of the round-robin test: a rotating
  conversation's new tail is such a block, the one part of it RAM could keep);
- its key is then remembered, on a *ghost* list half as long as the tier holds blocks (of
  the lengths tried on the unit test's sequences, the best overall). Read back again while
  remembered, it recurs within half a tier's worth of reads: it enters the main segment as
  a reused block, making room in the main order, as every block read back did before;
- a candidate matched again in RAM moves to the main segment, reused;
- victims: one-off blocks (never matched), then candidates (oldest first), then the main
  segment in ``ReuseLevelPolicy``'s order (a conversation reused often stays, a stale one
  leaves).

Blocks the engine computes enter as before (the main segment, at their parent's level),
and so do blocks warm restart reads ahead (``record_prefetch``); a block read back while
pinned already (a pinned prefix's) is wanted in RAM, and ``HotTier`` makes room for it as
for a computed one (it waits on probation like any block read back). A conversation restored
while the tier has room waits on probation for its next turn; one restored into a full
tier is kept from its second restore on. The unit test's 12 conversations round robin
under a tier 1/7 of their working set: 17.6% of restored blocks from RAM, none with LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from omlx.domain.cache.reuse_eviction import ReuseLevelPolicy

# The ghost list remembers as many keys as the tier holds blocks, times this.
GHOST_SHARE = 0.5


class ProbationPolicy:
    """Probation for blocks read back from disk, ahead of a reuse-level main segment
    (implements ``EvictionPolicy``); O(1) per record, victims in their order."""

    def __init__(
        self, main: ReuseLevelPolicy | None = None, ghost_share: float = GHOST_SHARE
    ) -> None:
        self._main = main if main is not None else ReuseLevelPolicy()
        # Candidates read back from disk, oldest first: key -> (bytes, parent key).
        self._probation: OrderedDict[str, tuple[int, str | None]] = OrderedDict()
        # Keys read back from disk that RAM did not keep, most recent last.
        self._ghost: OrderedDict[str, None] = OrderedDict()
        self._ghost_share = ghost_share

    def record_insert(self, key: str, nbytes: int, parent_key: str | None) -> None:
        """A block the engine computed: the main segment, as ``ReuseLevelPolicy`` places it."""
        self._main.record_insert(key, nbytes, parent_key)

    def record_hit(self, key: str, nbytes: int) -> None:
        """Matched in RAM: a candidate's second use moves it to the main segment, reused."""
        candidate = self._probation.pop(key, None)
        if candidate is not None:
            self._main.record_promotion(key, nbytes, candidate[1])
        else:
            self._main.record_hit(key, nbytes)

    def record_promotion(self, key: str, nbytes: int, parent_key: str | None) -> None:
        """Read back from disk and kept in RAM: remembered, the main segment; else probation."""
        if key in self._ghost:
            del self._ghost[key]
            self._main.record_promotion(key, nbytes, parent_key)
        else:
            self._probation[key] = (nbytes, parent_key)

    def record_access(self, key: str, nbytes: int) -> None:
        """Recency only; a candidate keeps its place (the request that read it, again)."""
        if key not in self._probation:
            self._main.record_access(key, nbytes)

    def record_prefetch(self, key: str, nbytes: int, parent_key: str | None) -> None:
        self._main.record_prefetch(key, nbytes, parent_key)

    def remove(self, key: str) -> None:
        if self._probation.pop(key, None) is not None:
            self._remember(key)  # it leaves unused: read back again soon, it has earned RAM
        else:
            self._main.remove(key)

    def is_candidate(self, key: str) -> bool:
        """Whether ``key`` is held on probation."""
        return key in self._probation

    def remembers(self, key: str) -> bool:
        """Whether ``key`` is on the ghost list (read back, not kept)."""
        return key in self._ghost

    def choose_victims(self, bytes_to_free: int, is_pinned: Callable[[str], bool]) -> list[str]:
        victims, freed = self._main.one_off_victims(bytes_to_free, is_pinned)
        if freed < bytes_to_free:
            candidates = self._candidate_victims(bytes_to_free - freed, is_pinned)
            victims += candidates
            freed += sum(self._probation[k][0] for k in candidates)
        if freed < bytes_to_free:
            chosen = set(victims)
            victims += self._main.choose_victims(
                bytes_to_free - freed, lambda k: k in chosen or is_pinned(k)
            )
        return victims

    def promotion_victims(
        self, key: str, bytes_to_free: int, is_pinned: Callable[[str], bool]
    ) -> list[str] | None:
        """Remembered: any victims, in order. Else other candidates only, or None (the key
        remembered) where they do not free enough."""
        if key in self._ghost:
            return self.choose_victims(bytes_to_free, is_pinned)
        victims = self._candidate_victims(bytes_to_free, is_pinned)
        if sum(self._probation[k][0] for k in victims) < bytes_to_free:
            self._remember(key)
            return None
        return victims

    def __len__(self) -> int:
        return len(self._main) + len(self._probation)

    def __contains__(self, key: object) -> bool:
        return key in self._probation or key in self._main

    def _candidate_victims(self, bytes_to_free: int, is_pinned: Callable[[str], bool]) -> list[str]:
        victims: list[str] = []
        freed = 0
        for key, (nbytes, _) in self._probation.items():
            if freed >= bytes_to_free:
                break
            if not is_pinned(key):
                victims.append(key)
                freed += nbytes
        return victims

    def _remember(self, key: str) -> None:
        ghost = self._ghost
        ghost[key] = None
        ghost.move_to_end(key)
        limit = max(int(self._ghost_share * len(self)), 1)
        while len(ghost) > limit:
            ghost.popitem(last=False)
