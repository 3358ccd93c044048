"""Batched, verified reads of block files: read-ahead threads and a time budget per batch.

Reading and hashing large buffers release the GIL, so a few threads keep the disk's
queue full while the caller decodes the previous file: on the bench machine (2 cores,
virtio disk, busy) 32 files took 0.41 s on 1 thread, 0.33 s on 2, 0.20 s on 4 and
0.13-0.18 s on 6-12 (bench/restore.py, docs/benchmarks.md). A batch that takes longer
than its budget (a hung network share) ends with a ``TIMED_OUT`` read, a miss the caller
recomputes, as SGLang HiCache's ``timeout`` prefetch policy does.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from omlx.domain.cache.blocks import BlockRead, ReadFailure, StoredBlock

READ_THREADS = 8
READ_AHEAD_PER_THREAD = 2
# Budget of one batch: a base plus a share per token, capped. Generous next to a local
# disk (2,048 tokens read in ~0.2 s here) and well under recomputing them (~20-30 s).
BUDGET_BASE_S = 5.0
BUDGET_PER_1K_TOKENS_S = 1.0
BUDGET_CAP_S = 30.0


def batch_budget(blocks: Sequence[StoredBlock]) -> float:
    tokens = sum(b.token_count for b in blocks)
    return min(BUDGET_CAP_S, BUDGET_BASE_S + BUDGET_PER_1K_TOKENS_S * tokens / 1000)


def verified_read(read: Callable[[str], bytes | memoryview], block: StoredBlock) -> BlockRead:
    """``block``'s file through ``read``, checked against the row's size and SHA-256."""
    try:
        data = read(block.relpath)
    except FileNotFoundError:
        return BlockRead(block, None, ReadFailure.MISSING)
    except (OSError, ValueError) as exc:  # ValueError: a relpath that escapes the folder
        # A store that names its fault (an object store down) has logged it once already.
        failure = ReadFailure.UNAVAILABLE if getattr(exc, "fault", None) else ReadFailure.UNREADABLE
        return BlockRead(block, None, failure, str(exc))
    if len(data) != block.nbytes:
        return BlockRead(
            block, None, ReadFailure.MISMATCH, f"{len(data)} bytes, row says {block.nbytes}"
        )
    if hashlib.sha256(data).hexdigest() != block.checksum:
        return BlockRead(block, None, ReadFailure.MISMATCH, "checksum differs")
    return BlockRead(block, data)


class ReadAhead:
    """``read_many`` for a store: up to ``threads * READ_AHEAD_PER_THREAD`` files ahead."""

    def __init__(
        self,
        read_one: Callable[[StoredBlock], BlockRead],
        threads: int = READ_THREADS,
        budget: Callable[[Sequence[StoredBlock]], float] = batch_budget,
    ) -> None:
        self._read_one = read_one
        self._threads = max(threads, 1)
        self._budget = budget
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # made on the first batch

    def read_many(self, blocks: Sequence[StoredBlock]) -> Generator[BlockRead, None, None]:
        if not blocks:
            return
        budget = self._budget(blocks)
        deadline = time.monotonic() + budget
        pool = self._get_pool()
        window = self._threads * READ_AHEAD_PER_THREAD
        ahead: deque[Future[BlockRead]] = deque(
            pool.submit(self._read_one, b) for b in blocks[:window]
        )
        following = window
        try:
            for block in blocks:
                future = ahead.popleft()
                if following < len(blocks):
                    ahead.append(pool.submit(self._read_one, blocks[following]))
                    following += 1
                try:
                    read = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except FutureTimeout:
                    yield BlockRead(block, None, ReadFailure.TIMED_OUT, f"budget {budget:.1f} s")
                    return
                yield read
        finally:
            for pending in ahead:  # stopped early: files not yet read are not read
                pending.cancel()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _get_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="omlx-cold-read")
            return self._pool
