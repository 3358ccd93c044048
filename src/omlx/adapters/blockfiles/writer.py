"""``BlockWriter``: the background thread that turns queued block bytes into files and index rows.

Fed bytes only (it never touches MLX). Per job: make room within the budget (LRU
first, pinned never), write the file durably, then add the row: a row never exists
without its complete file. A full queue, a full disk or an unreachable index drops the
write, never blocks.

With an index ``shared`` by several servers (docs/multi-machine.md) the file name
carries its checksum and the first row for a key wins: a writer that loses deletes its
own file unless the winner's row names that very file. The budget is the share's, so
the byte total is read before every write and checked again after it (two servers may
add at once); eviction spares blocks any server used within ``lease`` seconds.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from omlx.adapters.blockfiles.budget import DiskBudget
from omlx.adapters.disk_faults import NO_SPACE, FaultEpisodes, fault_of
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo, StoredBlock
from omlx.domain.cache.eviction import evict
from omlx.domain.ports import BlockIndex, BlockStore, IndexUnavailable

log = logging.getLogger(__name__)

_USED_REFRESH_S = 30.0  # re-read the index's byte total this often (others may remove rows)
_EVICTION_WAIT_S = 2.0  # how long to wait for another server's eviction before dropping


@dataclass(frozen=True, slots=True)
class WriteJob:
    """One full block's file bytes, ready to write."""

    meta: BlockMeta
    namespace: NamespaceInfo
    data: bytes


@dataclass(slots=True)
class WriterStats:
    written: int = 0
    written_bytes: int = 0
    write_seconds: float = 0.0
    skipped_existing: int = 0
    lost_races: int = 0  # another server recorded the key first (a shared index)
    dropped_queue_full: int = 0
    dropped_no_space: int = 0
    dropped_read_only: int = 0
    dropped_io_error: int = 0
    dropped_damaged: int = 0
    dropped_closed: int = 0
    dropped_error: int = 0
    dropped_index_unavailable: int = 0
    evicted_blocks: int = 0
    evicted_bytes: int = 0


class BlockWriter:
    """Implements the domain's ``BlockSink``; one thread, a bounded queue, started at once."""

    def __init__(
        self,
        store: BlockStore,
        index: BlockIndex,
        budget: DiskBudget,
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
        self._shared = shared
        self._lease = lease
        self._index = index
        self._budget = budget
        self._is_pinned = is_pinned
        self._clock = clock
        self._tick = tick  # e.g. RecencyBuffer.maybe_flush: index writes stay on this thread
        self._tick_interval = tick_interval
        self._queue: queue.Queue[WriteJob] = queue.Queue(maxsize=queue_size)
        self._pending: set[str] = set()
        self._lock = threading.Lock()  # pending keys and stats
        self._stats = WriterStats()
        self._namespaces: set[str] = set()
        self._orphans: set[str] = set()  # files whose row failed and that could not be removed
        self._used: int | None = None
        self._used_at = 0.0
        self._abandoned = 0  # jobs dropped by a close that ran out of time
        # One warning per episode of a full disk or read-only folder, one when it ends.
        self._faults = FaultEpisodes(f"cache folder {getattr(store, 'root', '')}".rstrip(), log)
        self._closing = threading.Event()
        self._abort = threading.Event()
        self._thread = threading.Thread(target=self._run, name="omlx-block-writer", daemon=True)
        self._thread.start()

    # --- BlockSink ---------------------------------------------------------------

    def submit(self, meta: BlockMeta, namespace: NamespaceInfo, data: bytes) -> bool:
        """Queue a block; never blocks. False when dropped (queue full, or closing)."""
        with self._lock:
            if meta.key in self._pending:
                return True  # write-through queues each block once
            if self._closing.is_set():
                self._stats.dropped_closed += 1
                return False
            try:
                self._queue.put_nowait(WriteJob(meta, namespace, bytes(data)))
            except queue.Full:
                self._stats.dropped_queue_full += 1
                dropped = self._stats.dropped_queue_full
            else:
                self._pending.add(meta.key)
                return True
        log.warning(
            "block writer queue is full; block %s not written (%d dropped)", meta.key, dropped
        )
        return False

    def pending(self, key: str) -> bool:
        with self._lock:
            return key in self._pending

    def pending_keys(self) -> frozenset[str]:
        """Keys queued but not yet on disk and in the index."""
        with self._lock:
            return frozenset(self._pending)

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {**asdict(self._stats), "queued": self._queue.qsize()}

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
                job = self._queue.get(block=not closing, timeout=self._tick_interval)
            except queue.Empty:
                if closing:
                    break
                job = None
            if job is not None:
                self._process_safely(job)
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

    def _drop_remaining(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            self._abandoned += 1
            self._finish(job.meta.key, "dropped_closed")

    def _process_safely(self, job: WriteJob) -> None:
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
                self._used = None  # re-read usage and free space before the next write
                outcome = f"dropped_{fault}"
        else:
            if outcome == "written":
                self._faults.succeeded()
                if self._orphans:
                    self._retry_orphans()
        self._finish(job.meta.key, outcome)

    def _finish(self, key: str, outcome: str) -> None:
        with self._lock:
            self._pending.discard(key)
            if outcome != "written":
                setattr(self._stats, outcome, getattr(self._stats, outcome) + 1)

    def _process(self, job: WriteJob) -> str:
        meta, data = job.meta, job.data
        if meta.key in self._index.get_blocks([meta.key]):
            return "skipped_existing"
        if job.namespace.digest not in self._namespaces:
            self._index.upsert_namespace(job.namespace)
            self._namespaces.add(job.namespace.digest)
        if not self._make_room(len(data)):
            self._faults.failed(
                NO_SPACE,
                "no room within paged_ssd_cache_max_size and the disk's free-space reserve",
            )
            log.debug("no room within the cache budget for block %s; not written", meta.key)
            return "dropped_no_space"
        checksum = hashlib.sha256(data).hexdigest()
        relpath = self._store.relpath(job.namespace, meta.key, checksum)
        started = time.perf_counter()
        self._store.write(relpath, data)  # a full disk or read-only folder: _process_safely
        now = self._clock()
        block = StoredBlock(
            key=meta.key,
            namespace=meta.namespace,
            parent_key=meta.parent_key,
            token_count=meta.token_count,
            nbytes=len(data),
            checksum=checksum,
            relpath=relpath,
            created_at=now,
            last_access=now,
            kind=meta.kind,
        )
        try:
            recorded = self._add_row(job.namespace, block, meta.tokens)
        except Exception:
            self._delete_orphan(relpath)  # no row: the file must not linger as an orphan
            raise
        if not recorded:
            self._lose_race(block)
            return "lost_races"
        if self._shared and not self._still_within_budget(block):
            return "dropped_no_space"
        elapsed = time.perf_counter() - started
        with self._lock:
            self._stats.written += 1
            self._stats.written_bytes += len(data)
            self._stats.write_seconds += elapsed
        self._used = (self._used or 0) + len(data)
        return "written"

    def _delete_orphan(self, relpath: str) -> None:
        """Remove a file whose row was not written; when the folder refuses even that (it
        became read-only), remember it and retry after the next successful write."""
        try:
            self._store.delete(relpath)
        except OSError:
            self._orphans.add(relpath)

    def _retry_orphans(self) -> None:
        for relpath in list(self._orphans):
            try:
                self._store.delete(relpath)
            except OSError:
                return
            self._orphans.discard(relpath)

    def _add_row(self, namespace: NamespaceInfo, block: StoredBlock, tokens: Sequence[int]) -> bool:
        try:
            return self._index.add_block(block, tokens)
        except IndexUnavailable:
            raise
        except Exception as exc:
            if fault_of(exc) is not None:
                raise
            # An admin may have dropped the namespace row (cache clear): restore it once.
            log.info("re-recording namespace %s after a failed insert", namespace.digest[:12])
            self._index.upsert_namespace(namespace)
            return self._index.add_block(block, tokens)

    def _lose_race(self, block: StoredBlock) -> None:
        """Another writer recorded this key first: keep only the file its row names."""
        winner = self._index.get_blocks([block.key]).get(block.key)
        if winner is None or winner.relpath != block.relpath:
            self._store.delete(block.relpath)
        log.debug("block %s was recorded by another server first", block.key)

    def _still_within_budget(self, block: StoredBlock) -> bool:
        """After our insert: if servers writing at once overshot the shared budget, evict or undo ours."""
        used = self._index.total_bytes()
        limit = self._budget.limit(used)
        if used > limit:
            self._evict(limit)
            used = self._index.total_bytes()
        self._used, self._used_at = used, time.monotonic()
        if used <= limit:
            return True
        log.warning(
            "the shared cache budget is full of recently used blocks; block %s undone", block.key
        )
        self._index.remove_blocks([block.key])  # row first, file second
        self._store.delete(block.relpath)
        self._used = None
        return False

    def _make_room(self, incoming: int) -> bool:
        """Evict LRU blocks so ``incoming`` more bytes fit the budget; False if they cannot."""
        now = time.monotonic()
        if self._shared or self._used is None or now - self._used_at > _USED_REFRESH_S:
            self._used, self._used_at = self._index.total_bytes(), now
        limit = self._budget.limit(self._used)
        if self._used + incoming <= limit:
            return True
        if incoming > limit:
            return False  # evicting frees disk as it shrinks usage: the limit stays; never fits
        self._evict(limit - incoming)
        self._used, self._used_at = self._index.total_bytes(), time.monotonic()
        return self._used + incoming <= limit

    def _evict(self, max_bytes: int) -> None:
        """Evict down to ``max_bytes``, waiting a little while another server evicts."""
        deadline = time.monotonic() + _EVICTION_WAIT_S
        while True:
            accessed_before = self._clock() - self._lease if self._shared else None
            victims = evict(
                self._index,
                self._store,
                max_bytes,
                self._is_pinned,
                accessed_before=accessed_before,
            )
            if victims is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if victims:
            with self._lock:
                self._stats.evicted_blocks += len(victims)
                self._stats.evicted_bytes += sum(v.nbytes for v in victims)
