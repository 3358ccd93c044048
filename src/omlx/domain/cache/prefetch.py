"""Warm restart's prefetch: a recorded hot set read from the cold tier into free RAM.

Runs on its own thread, beside the engine, and yields to it: it waits while requests
run (``busy``), reads a few blocks per batch through the cold tier's verified batch read
(the same read, checks and zero-copy decode a request's restore uses: its payloads hold
no MLX arrays, so any thread may make them), and adds each block with ``HotTier.fill``,
which holds the tier's lock only for the insert, evicts nothing and leaves a block a
request brought in as it is. It stops when RAM is full. A block missing or damaged on
disk is skipped and counted (the cold tier drops a damaged one, as it does for a request).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.hot_set import HotSet, HotSetEntry
from omlx.domain.cache.hot_tier import FULL, HELD, HotTier
from omlx.domain.cache.keys import KV
from omlx.domain.cache.ports import ColdSource

log = logging.getLogger(__name__)

BATCH_BLOCKS = 8  # blocks per read: short enough that a request arriving waits for none
BUSY_POLL_S = 0.05

RUNNING, DONE, OFF = "running", "done", "off"


@dataclass(frozen=True, slots=True)
class PrefetchProgress:
    """Where a prefetch stands: of the hot set's ``planned_*``, what is in RAM now."""

    state: str  # running | done | off
    planned_blocks: int = 0
    planned_bytes: int = 0
    blocks: int = 0  # read into RAM
    bytes: int = 0
    held: int = 0  # already in RAM when their turn came (a request read them first)
    skipped: int = 0  # missing or damaged on disk, or unreadable
    seconds: float = 0.0
    ended: str = ""  # why it ended before the list did: "budget full", "stopped"


class Prefetch:
    """Reads one hot set into a hot tier, most recent conversation first (``run``)."""

    def __init__(
        self,
        hot_set: HotSet,
        *,
        hot: HotTier,
        cold: ColdSource,
        nbytes: Callable[[Any], int],
        busy: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        batch_blocks: int = BATCH_BLOCKS,
    ) -> None:
        self._set, self._hot, self._cold, self._nbytes = hot_set, hot, cold, nbytes
        self._busy, self._clock, self._batch = busy, clock, max(batch_blocks, 1)
        self._lock = threading.Lock()
        self._progress = PrefetchProgress(RUNNING, len(hot_set.entries), hot_set.nbytes)
        self._next = 0  # entries before it have had their turn
        self._started: float | None = None

    def progress(self) -> PrefetchProgress:
        with self._lock:
            p = self._progress
            if p.state == RUNNING and self._started is not None:
                return replace(p, seconds=round(self._clock() - self._started, 3))
            return p

    def remaining(self) -> tuple[HotSetEntry, ...]:
        """The entries not read yet (a shutdown during the prefetch records them again)."""
        with self._lock:
            return self._set.entries[self._next :]

    def run(self, stop: threading.Event) -> PrefetchProgress:
        """Read the hot set until it ends, RAM is full or ``stop`` is set; the final progress."""
        self._started = self._clock()
        ended = ""
        for end, batch in self._batches():
            while self._busy() and not stop.is_set():
                stop.wait(BUSY_POLL_S)  # a request runs: the disk and the cores are its
            if stop.is_set():
                ended = "stopped"
                break
            if not self._read(batch):
                ended = "budget full"
                break
            with self._lock:
                self._next = end
        with self._lock:
            self._progress = replace(
                self._progress,
                state=DONE,
                ended=ended,
                seconds=round(self._clock() - self._started, 3),
            )
            return self._progress

    def _batches(self) -> Iterator[tuple[int, list[HotSetEntry]]]:
        """Runs of a chain (each KV block extending the previous), at most a batch long,
        and restore-point objects alone; each with the index of the entry after it."""
        batch: list[HotSetEntry] = []
        for i, entry in enumerate(self._set.entries):
            extends = batch and entry.kind == KV and batch[-1].kind == KV
            if batch and not (extends and entry.parent_key == batch[-1].key):
                yield i, batch
                batch = []
            batch.append(entry)
            if len(batch) >= self._batch or entry.kind != KV:
                yield i + 1, batch
                batch = []
        if batch:
            yield len(self._set.entries), batch

    def _read(self, batch: Sequence[HotSetEntry]) -> bool:
        """Read ``batch`` into RAM; False when RAM is full (the prefetch ends)."""
        wanted: list[HotSetEntry] = []
        room = self._hot.free_bytes()
        held = 0
        for entry in batch:
            if entry.key in self._hot:
                held += 1
                continue
            if entry.nbytes > room:
                break
            room -= entry.nbytes
            wanted.append(entry)
        self._count(held=held)
        full = len(wanted) + held < len(batch)
        added = 0
        try:
            for entry, (tokens, payload, computed_by) in zip(
                wanted, self._fetch(wanted), strict=False
            ):
                meta = BlockMeta(
                    entry.key,
                    entry.parent_key,
                    self._set.namespace,
                    len(tokens),
                    entry.kind,
                    computed_by=computed_by,
                )
                size = self._nbytes(payload)
                outcome = self._hot.fill(meta, tuple(tokens), payload, size)
                if outcome == FULL:
                    full = True
                    break
                added += 1
                if outcome == HELD:  # a request read it meanwhile
                    self._count(held=1)
                else:
                    self._count(blocks=1, nbytes=size)
        except Exception:  # the port promises not to raise; a prefetch never fails a start
            log.exception("warm restart: reading %d blocks failed; skipped", len(wanted))
        if not full:
            # Those the read did not give back: no row, a missing or damaged file.
            self._count(skipped=len(wanted) - added)
        return not full

    def _fetch(self, wanted: Sequence[HotSetEntry]) -> Iterator[tuple[Sequence[int], Any, str]]:
        """Each entry's tokens and payload, to the first miss, with the server that computed
        it (its row's; a restore point's object: not asked)."""
        if not wanted:
            return
        if len(wanted) == 1 and wanted[0].kind != KV:
            found = self._cold.get(wanted[0].key, wanted[0].parent_key, touch=False)
            if found is not None:
                yield found[0], found[1], ""
            return
        # No recency touched on disk: a prefetch is no use of the blocks.
        chain = [(e.key, e.parent_key) for e in wanted]
        rows = self._cold.rows([key for key, _ in chain]) or {}  # the batch's one question
        with closing(self._cold.get_many(chain, touch=False, rows=rows)) as reads:
            for (key, _), (tokens, payload) in zip(chain, reads, strict=False):
                row = rows.get(key)
                yield tokens, payload, (row.computed_by or "") if row is not None else ""

    def _count(self, *, blocks: int = 0, nbytes: int = 0, held: int = 0, skipped: int = 0) -> None:
        with self._lock:
            p = self._progress
            self._progress = replace(
                p,
                blocks=p.blocks + blocks,
                bytes=p.bytes + nbytes,
                held=p.held + held,
                skipped=p.skipped + skipped,
            )
