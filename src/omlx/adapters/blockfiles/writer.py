"""``BlockWriter``: the background thread that turns queued block bytes into files and index rows.

Fed bytes only (it never touches MLX). Per job the domain's ``ColdWrites`` admits the
block (making room within the budget), this thread writes its file durably under a name
that carries its checksum, and ``ColdWrites`` adds the row: the write policy is the
domain's, the I/O and what a failure of the disk means are this thread's. A full
queue, a full disk or an unreachable index drops the write, with a log line and a
counter; the engine's write-through never blocks. A store that fails for a while (an
object store down or throttling) gets its writes tried again: a few, with backoff, in a
small queue of their own, then dropped and counted. An import asks to wait for room
instead and to be told each block's outcome (``submit(wait=, done=)``), so what it
reports as written is what the index holds.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from omlx.adapters.disk_faults import NO_SPACE, TRANSIENT, FaultEpisodes, fault_of
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.cold_writes import ColdWrites, WriteOutcome, WriterStats
from omlx.domain.cache.ports import BlockIndex, BlockStore, ByteBudget, IndexUnavailable
from omlx.domain.cache.tally import Tally

log = logging.getLogger(__name__)

RETRY_QUEUE = 64  # writes waiting for another try after a transient fault of the store
RETRY_ATTEMPTS = 4  # tries after the first, RETRY_FIRST_S apart and doubling: 1, 2, 4, 8 s
RETRY_FIRST_S = 1.0


@dataclass(frozen=True, slots=True)
class WriteJob:
    """One full block's file bytes, ready to write."""

    meta: BlockMeta
    namespace: NamespaceInfo
    data: bytes
    done: Callable[[str], None] | None = None  # told the outcome when the write ends


class BlockWriter:
    """Implements the domain's ``BlockSink``; one thread, a bounded queue, started at once."""

    def __init__(
        self,
        store: BlockStore,
        index: BlockIndex,
        budget: ByteBudget,
        *,
        queue_size: int = 256,
        is_pinned: Callable[[str], bool] = lambda key: False,
        clock: Callable[[], float] = time.time,
        tick: Callable[[], object] | None = None,
        tick_interval: float = 1.0,
        shared: bool = False,
        lease: float = 0.0,
    ) -> None:
        self._store = store
        self._tally = Tally()  # WriterStats' counters: this thread's and the policy's
        self._writes = ColdWrites(
            store,
            index,
            budget,
            is_pinned=is_pinned,
            clock=_CallClock(clock),
            shared=shared,
            lease=lease,
            tally=self._tally,
            disk_fault=lambda exc: fault_of(exc) is not None,
        )
        self._tick = tick  # e.g. RecencyBuffer.maybe_flush: index writes stay on this thread
        self._tick_interval = tick_interval
        self._queue: queue.Queue[WriteJob] = queue.Queue(maxsize=queue_size)
        self._pending: set[str] = set()
        self._lock = threading.Lock()  # pending keys, and the drops counted with them
        self._abandoned = 0  # jobs dropped by a close that ran out of time
        # Writes a transient fault failed: (when to try again, tries so far, the job).
        self._retries: deque[tuple[float, int, WriteJob]] = deque()
        self.retry_first_s = RETRY_FIRST_S
        # One warning per episode of a full disk or read-only folder, one when it ends.
        self._faults = FaultEpisodes(getattr(store, "label", "block store"), log)
        self._closing = threading.Event()
        self._abort = threading.Event()
        self._room_until = 0.0  # time.monotonic() before which a full queue is waited for
        self._thread = threading.Thread(target=self._run, name="omlx-block-writer", daemon=True)
        self._thread.start()

    # --- BlockSink ---------------------------------------------------------------

    def submit(
        self,
        meta: BlockMeta,
        namespace: NamespaceInfo,
        data: bytes,
        *,
        wait: float = 0.0,
        done: Callable[[str], None] | None = None,
    ) -> bool:
        """Queue a block, waiting up to ``wait`` s for room. False when dropped (queue full,
        or closing); ``done`` is told the outcome once the write ends (see ``BlockSink``)."""
        with self._lock:
            if meta.key in self._pending:
                already = True  # write-through queues each block once
            elif self._closing.is_set():
                self._tally.add(dropped_closed=1)
                return False
            else:
                already = False
                self._pending.add(meta.key)  # before the put: the thread may finish it at once
        if already:
            if done is not None:
                done(WriteOutcome.EXISTING)  # another caller's write of the same block
            return True
        job = WriteJob(meta, namespace, bytes(data), done)  # copied only for a block it queues
        wait = max(wait, self._room_until - time.monotonic())
        try:
            # Not under the lock: the thread takes it to finish the jobs that make room.
            self._queue.put(job, block=wait > 0, timeout=wait if wait > 0 else None)
        except queue.Full:
            with self._lock:
                self._pending.discard(meta.key)
                self._tally.add(dropped_queue_full=1)
                dropped = self._tally.read()["dropped_queue_full"]
            log.warning(
                "block writer queue is full; block %s not written (%d dropped)", meta.key, dropped
            )
            return False
        return True

    def wait_for_room(self, seconds: float) -> None:
        """For the next ``seconds``, a submit waits for room in a full queue instead of
        dropping its block: the server is stopping, and what its engines keep last (the
        generations it cut) would otherwise be lost with RAM. No request waits on it then."""
        self._room_until = time.monotonic() + seconds

    def pending(self, key: str) -> bool:
        with self._lock:
            return key in self._pending

    def has_room(self) -> bool:
        if self._closing.is_set():
            return False
        return not self._queue.full() or time.monotonic() < self._room_until

    def pending_keys(self) -> frozenset[str]:
        """Keys queued but not yet on disk and in the index."""
        with self._lock:
            return frozenset(self._pending)

    def stats(self) -> WriterStats:
        """The counters so far, and the blocks queued now."""
        return self._tally.read_as(
            WriterStats, queued=self._queue.qsize(), awaiting_retry=len(self._retries)
        )

    def close(self, timeout: float = 30.0) -> bool:
        """Stop taking jobs, drain the queue for up to ``timeout`` s, stop. True when drained."""
        with self._lock:
            self._closing.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            # Out of time: finish the current job, drop the rest (counted below).
            self._abort.set()
            self._thread.join(max(1.0, timeout / 10))
        alive = self._thread.is_alive()
        if self._abandoned or alive:
            log.warning(
                "block writer closed with %d queued blocks unwritten",
                self._abandoned or self._queue.qsize(),
            )
        return self._abandoned == 0 and not alive

    # --- the thread --------------------------------------------------------------

    def _run(self) -> None:
        last_tick = time.monotonic()
        while not self._abort.is_set():
            closing = self._closing.is_set()
            try:
                job = self._queue.get(block=not closing, timeout=self._wait_s())
            except queue.Empty:
                if closing:
                    break
                job = None
            if job is not None:
                self._process_safely(job)
            self._retry_due()
            if time.monotonic() - last_tick >= self._tick_interval:
                last_tick = time.monotonic()
                self._run_tick()
        self._drop_remaining()
        self._run_tick()

    def _run_tick(self) -> None:
        if self._tick is None:
            return
        try:
            self._tick()
        except Exception as exc:
            fault = fault_of(exc)
            if fault is None:
                log.exception("block writer tick failed")
            else:  # recency touches cannot be written either: the same episode
                self._faults.failed(fault, exc)

    def _wait_s(self) -> float:
        """How long the thread may wait for a job: until the next tick or retry is due."""
        if not self._retries:
            return self._tick_interval
        return max(0.0, min(self._tick_interval, self._retries[0][0] - time.monotonic()))

    def _retry_due(self) -> None:
        """Try again the writes whose time has come (the queue is kept in due order)."""
        while self._retries and self._retries[0][0] <= time.monotonic():
            if self._abort.is_set():
                return
            _, tries, job = self._retries.popleft()
            self._process_safely(job, tries)

    def _defer(self, job: WriteJob, tries: int) -> bool:
        """Queue ``job`` for another try after a transient fault; False when it is dropped
        instead (tried enough, the retry queue full, or closing)."""
        if tries >= RETRY_ATTEMPTS or len(self._retries) >= RETRY_QUEUE or self._closing.is_set():
            return False
        due = time.monotonic() + self.retry_first_s * 2**tries
        self._retries.append((due, tries + 1, job))
        self._tally.add(retried=1)
        return True

    def _drop_remaining(self) -> None:
        while self._retries:  # closing: a store that is down now is not waited for
            _, _, job = self._retries.popleft()
            self._abandoned += 1
            self._finish(job, "dropped_closed")
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            self._abandoned += 1
            self._finish(job, "dropped_closed")

    def _process_safely(self, job: WriteJob, tries: int = 0) -> None:
        try:
            outcome = self._process(job)
        except IndexUnavailable as exc:  # already logged once by the index, unless the disk
            log.debug("block %s not written: %s", job.meta.key, exc)
            fault = fault_of(exc)
            if fault is None:
                outcome = "dropped_index_unavailable"
            else:  # SQLite on a full or read-only disk
                self._faults.failed(fault, exc.__cause__ or exc)
                outcome = f"dropped_{fault}"
        except Exception as exc:
            fault = fault_of(exc)
            if fault is None:
                log.exception("writing block %s failed; dropped", job.meta.key)
                outcome = "dropped_error"
            else:
                self._faults.failed(fault, exc)
                log.debug("block %s not written: %s", job.meta.key, exc)
                self._writes.forget_usage()  # re-read usage and free space before the next write
                if fault in TRANSIENT and self._defer(job, tries):
                    return  # still pending: tried again later
                outcome = f"dropped_{fault}"
        else:
            if outcome == WriteOutcome.WRITTEN:
                self._faults.succeeded()
        self._finish(job, outcome)

    def _finish(self, job: WriteJob, outcome: str) -> None:
        """The job is done: no longer pending, counted unless written (counted with its
        bytes), and its submitter told."""
        with self._lock:
            self._pending.discard(job.meta.key)
            if outcome != WriteOutcome.WRITTEN:
                self._tally.add(**{str(outcome): 1})
        if job.done is not None:
            try:
                job.done(str(outcome))
            except Exception:  # the submitter's bookkeeping must not stop the writer
                log.exception("reporting block %s's write failed", job.meta.key)

    def _process(self, job: WriteJob) -> str:
        meta, namespace, data = job.meta, job.namespace, job.data
        refused = self._writes.admit(meta, namespace, len(data))
        if refused is not None:
            if refused is WriteOutcome.NO_ROOM:
                self._faults.failed(
                    NO_SPACE,
                    "no room within paged_ssd_cache_max_size and the disk's free-space reserve",
                )
            return refused
        checksum = hashlib.sha256(data).hexdigest()
        relpath = self._store.relpath(namespace, meta.key, checksum)
        started = time.perf_counter()
        self._store.write(relpath, data)  # a full disk or read-only folder: _process_safely
        outcome = self._writes.record(namespace, meta, relpath, checksum, len(data))
        if outcome is WriteOutcome.WRITTEN:
            elapsed = time.perf_counter() - started
            self._tally.add(written=1, written_bytes=len(data), write_seconds=elapsed)
        return outcome


@dataclass(frozen=True, slots=True)
class _CallClock:
    """The domain's ``Clock`` over the writer's ``clock`` callable."""

    call: Callable[[], float]

    def now(self) -> float:
        return self.call()
