"""Writing many blocks with back-pressure, each write's outcome counted (an archive's import).

The engine's write-through drops a block when the writer's queue is full: a block it
computes is worth less than not stalling a request. An import is different: the client
was told how many blocks were written, so it must wait for room and then for each
write to end (102,000 "queued" blocks once became 3,083 rows, the rest dropped without
a word). A few writes are kept in flight at a time, so an archive of any size holds a
bounded number of block files in memory. Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from omlx.domain.cache.blocks import BlockMeta

IN_FLIGHT = 8  # blocks queued at once by one import (their bytes are held until written)
WAIT_S = 120.0  # for room in the writer's queue, and for the last writes to end
NOT_QUEUED = "dropped_queue_full"  # the writer refused the block (queue full, or closing)
STILL_PENDING = "still_pending"  # queued, but not written when the wait ended

Submit = Callable[..., bool]  # BlockSink.submit, bound to a namespace by the caller


class _Outcomes:
    """How many writes ended each way, and how many are still in flight."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._in_flight = 0
        self._changed = threading.Condition()

    def start(self) -> None:
        with self._changed:
            self._in_flight += 1

    def end(self, outcome: str) -> None:
        with self._changed:
            self.counts[outcome] += 1
            self._in_flight -= 1
            self._changed.notify_all()

    def wait_for_fewer_than(self, n: int, timeout: float) -> int:
        """Wait until fewer than ``n`` writes are in flight (or ``timeout``); how many are."""
        with self._changed:
            self._changed.wait_for(lambda: self._in_flight < n, max(0.0, timeout))
            return self._in_flight


def write_all(
    submit: Submit,
    blocks: Iterable[tuple[BlockMeta, bytes]],
    *,
    in_flight: int = IN_FLIGHT,
    wait: float = WAIT_S,
) -> Counter[str]:
    """Submit ``blocks`` with back-pressure and wait for their writes; how many ended each
    way (``WriteOutcome`` values and the writer's drop reasons, ``NOT_QUEUED``,
    ``STILL_PENDING``). ``wait`` bounds each wait for progress, not the whole import."""
    outcomes = _Outcomes()
    for meta, data in blocks:
        outcomes.wait_for_fewer_than(in_flight, wait)
        outcomes.start()
        if not submit(meta, data, wait=wait, done=outcomes.end):
            outcomes.end(NOT_QUEUED)
    deadline = time.monotonic() + wait
    left = outcomes.wait_for_fewer_than(1, deadline - time.monotonic())
    counts = outcomes.counts.copy()
    if left:
        counts[STILL_PENDING] += left
    return counts
