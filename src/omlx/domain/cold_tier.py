"""The cold tier (DESIGN §4): verified reads of block files, write-through puts, batched recency.

A block is served only when its file matches the checksum in the index and its tokens
rehash to its key; anything else is logged, counted, removed (row, then file) and
recomputed by the caller. A prefix's blocks are read in one batch (``get_many``): one
index query, files read and hashed on a few threads (both release the GIL) while the
caller's thread decodes them in order. Standard library only.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from omlx.domain.blocks import BlockMeta, DecodedBlock, NamespaceInfo, StoredBlock
from omlx.domain.eviction import plan_eviction
from omlx.domain.keys import block_key
from omlx.domain.ports import BlockIndex, BlockSink, BlockStore, Clock

log = logging.getLogger(__name__)

# Candidates for token-granular matching asked of the index per lookup: the prefix cache
# reads at most a few of them, most recently used first.
CHILDREN_LIMIT = 16

# Threads reading and hashing block files for ``get_many``, up to READ_AHEAD_PER_THREAD
# files each ahead of the decoding thread. Parallel reads keep the disk's queue full:
# on the bench machine (2 cores, virtio disk, busy) 32 files took 0.41 s on 1 thread,
# 0.33 s on 2, 0.20 s on 4 and 0.13-0.18 s on 6-12 (bench/restore.py, docs/benchmarks.md).
READ_THREADS = 8
READ_AHEAD_PER_THREAD = 2


class _SystemClock:
    def now(self) -> float:
        return time.time()


class RecencyBuffer:
    """Hits kept in memory and written to the index in one batch (not one write per hit).

    ``record`` never writes unless ``max_pending`` keys pile up; the writer thread calls
    ``maybe_flush`` every few seconds and ``flush`` runs at shutdown, so LRU order survives.
    """

    def __init__(
        self,
        index: BlockIndex,
        clock: Clock | None = None,
        *,
        interval: float = 5.0,
        max_pending: int = 4096,
    ) -> None:
        self._index = index
        self._clock: Clock = clock if clock is not None else _SystemClock()
        self.interval = interval
        self._max_pending = max_pending
        self._hits: dict[str, float] = {}
        self._last_flush = self._clock.now()
        self._lock = threading.Lock()

    def record(self, keys: Sequence[str]) -> None:
        now = self._clock.now()
        with self._lock:
            for key in keys:
                self._hits[key] = now
            full = len(self._hits) >= self._max_pending
        if full:
            self.flush()

    def pending(self) -> int:
        with self._lock:
            return len(self._hits)

    def maybe_flush(self) -> int:
        """Flush when ``interval`` seconds have passed since the last flush."""
        if self._clock.now() - self._last_flush < self.interval:
            return 0
        return self.flush()

    def flush(self) -> int:
        """Write every buffered hit; returns how many keys were written."""
        with self._lock:
            batch, self._hits = self._hits, {}
            self._last_flush = self._clock.now()
        if not batch:
            return 0
        try:
            self._index.touch(batch)
        except Exception:
            # Recency is advisory: keep the hits for the next flush rather than fail a caller.
            log.exception("recency flush of %d keys failed; will retry", len(batch))
            with self._lock:
                for key, at in batch.items():
                    self._hits[key] = max(at, self._hits.get(key, at))
            return 0
        return len(batch)


def evict(
    index: BlockIndex,
    store: BlockStore,
    bytes_to_free: int,
    is_pinned: Callable[[str], bool],
    *,
    used: int | None = None,
) -> list[StoredBlock]:
    """Remove least recently used unpinned blocks until ``bytes_to_free`` bytes are gone.

    Rows go first (one transaction), files after the commit (DESIGN §4): a crash in
    between leaves files without rows, which reconcile removes, never rows without files.
    """
    if bytes_to_free <= 0:
        return []
    used = index.total_bytes() if used is None else used
    page = 256
    while True:
        # lru_blocks has no offset: widen the page until it holds enough unpinned bytes.
        candidates = index.lru_blocks(page)
        victims = plan_eviction(candidates, used, used - bytes_to_free, is_pinned)
        if sum(v.nbytes for v in victims) >= bytes_to_free or len(candidates) < page:
            break
        page *= 4
    if victims:
        index.remove_blocks([v.key for v in victims])
        for victim in victims:
            store.delete(victim.relpath)
    return victims


@dataclass(slots=True)
class ColdTierStats:
    hits: int = 0
    misses: int = 0
    corrupt_blocks: int = 0
    missing_files: int = 0
    queued: int = 0
    dropped: int = 0


class ColdTier:
    """Implements ``ColdSource`` for one namespace over a block store, an index and a writer."""

    def __init__(
        self,
        namespace: NamespaceInfo,
        store: BlockStore,
        index: BlockIndex,
        writer: BlockSink,
        decode: Callable[[bytes], DecodedBlock],
        clock: Clock | None = None,
        recency: RecencyBuffer | None = None,
        *,
        read_threads: int = READ_THREADS,
    ) -> None:
        self.namespace = namespace
        self._store = store
        self._index = index
        self._writer = writer
        self._decode = decode
        self._clock: Clock = clock if clock is not None else _SystemClock()
        self.recency = recency if recency is not None else RecencyBuffer(index, self._clock)
        self.stats = ColdTierStats()
        self._lock = threading.Lock()  # counters and the pool
        self._read_threads = max(read_threads, 1)
        self._pool: ThreadPoolExecutor | None = None  # made on the first batch read

    def get(self, key: str, parent_key: str) -> tuple[tuple[int, ...], Any] | None:
        try:
            row = self._index.get_blocks([key]).get(key)
        except Exception:
            log.exception("index lookup of %s failed; treated as a miss", key)
            row = None
        if row is None or row.namespace != self.namespace.digest:
            self._count("misses")
            return None
        try:
            checked = self._read_checked(row)
        except Exception as exc:
            self._read_failed(row, exc)
            return None
        return self._serve(row, parent_key, checked)

    def get_many(
        self, chain: Sequence[tuple[str, str]]
    ) -> Generator[tuple[tuple[int, ...], Any], None, None]:
        if not chain:
            return
        try:
            rows = self._index.get_blocks([key for key, _ in chain])
        except Exception:
            log.exception("index lookup of %d blocks failed; treated as a miss", len(chain))
            self._count("misses")
            return
        found: list[tuple[StoredBlock, str]] = []
        for key, parent_key in chain:  # the chain ends at its first block without a row
            row = rows.get(key)
            if row is None or row.namespace != self.namespace.digest:
                break
            found.append((row, parent_key))
        if not found:
            self._count("misses")
            return
        pool = self._reader_pool()
        ahead: deque[Future[tuple[bytes, bool]]] = deque()
        todo = iter(found)
        try:
            for row, _ in todo:
                ahead.append(pool.submit(self._read_checked, row))
                if len(ahead) >= self._read_threads * READ_AHEAD_PER_THREAD:
                    break
            for row, parent_key in found:
                future = ahead.popleft()
                following = next(todo, None)
                if following is not None:
                    ahead.append(pool.submit(self._read_checked, following[0]))
                try:
                    checked = future.result()
                except Exception as exc:
                    self._read_failed(row, exc)
                    return
                served = self._serve(row, parent_key, checked)
                if served is None:
                    return
                yield served
            if len(found) < len(chain):
                self._count("misses")
        finally:
            for future in ahead:  # stopped early: files not yet read are not read
                future.cancel()

    def close(self) -> None:
        """Stop the read threads (shutdown); a later batch read starts them again."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def put(self, meta: BlockMeta, tokens: Sequence[int], data: bytes) -> None:
        if meta.namespace != self.namespace.digest or len(tokens) != meta.token_count:
            log.error("block %s does not match this namespace or its tokens; not stored", meta.key)
            self._count("dropped")
            return
        try:
            accepted = self._writer.submit(meta, self.namespace, data)
        except Exception:
            log.exception("queueing block %s failed; dropped", meta.key)
            accepted = False
        self._count("queued" if accepted else "dropped")

    def contains(self, key: str) -> bool:
        if self._writer.pending(key):
            return True
        try:
            return key in self._index.get_blocks([key])
        except Exception:
            log.exception("index lookup of %s failed", key)
            return False

    def children(self, parent_key: str) -> list[BlockMeta]:
        try:
            rows = self._index.children(parent_key, CHILDREN_LIMIT)
        except Exception:
            log.exception("index lookup of the children of %s failed", parent_key)
            return []
        return [
            BlockMeta(r.key, r.parent_key, r.namespace, r.token_count)
            for r in rows
            if r.namespace == self.namespace.digest
        ]

    def touch(self, keys: Sequence[str]) -> None:
        self.recency.record(keys)

    def flush(self) -> int:
        """Write buffered recency now (shutdown, tests)."""
        return self.recency.flush()

    def _reader_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self._read_threads, thread_name_prefix="omlx-cold-read"
                )
            return self._pool

    def _read_checked(self, row: StoredBlock) -> tuple[bytes, bool]:
        """The file's bytes and whether they match the index's size and checksum.

        Bytes only, so it may run on a read thread: reading and hashing large
        buffers release the GIL; decoding stays on the caller's thread.
        """
        data = self._store.read(row.relpath)
        ok = len(data) == row.nbytes and hashlib.sha256(data).hexdigest() == row.checksum
        return data, ok

    def _read_failed(self, row: StoredBlock, exc: BaseException) -> None:
        if isinstance(exc, FileNotFoundError):
            self._drop(row, "its file is missing", "missing_files")
        elif isinstance(exc, OSError):
            log.error("reading block %s failed (%s); treated as a miss", row.key, exc)
            self._count("misses")
        else:
            raise exc

    def _serve(
        self, row: StoredBlock, parent_key: str, checked: tuple[bytes, bool]
    ) -> tuple[tuple[int, ...], Any] | None:
        """Decode checked bytes and serve them, or drop the block; on the caller's thread."""
        decoded, problem = self._verify(row, parent_key, *checked)
        if decoded is None:
            self._drop(row, problem, "corrupt_blocks")
            return None
        self.recency.record((row.key,))
        self._count("hits")
        return decoded.tokens, decoded.payload

    def _verify(
        self, row: StoredBlock, parent_key: str, data: bytes, checksum_ok: bool
    ) -> tuple[DecodedBlock | None, str]:
        if not checksum_ok:
            return None, "its checksum does not match the index"
        try:
            decoded = self._decode(data)
        except Exception as exc:  # a codec bug on a bad file must not fail the request
            return None, f"it cannot be decoded ({exc})"
        if block_key(parent_key, decoded.tokens) != row.key:
            return None, "its tokens do not rehash to its key"
        if decoded.metadata.get("key", row.key) != row.key:
            return None, "its metadata names another key"
        return decoded, ""

    def _drop(self, row: StoredBlock, problem: str, counter: str) -> None:
        log.warning(
            "cold block %s (%s) is not served: %s; removing it", row.key, row.relpath, problem
        )
        self._count(counter)
        self._count("misses")
        try:
            self._index.remove_blocks([row.key])  # row first, file second
            self._store.delete(row.relpath)
        except Exception:
            log.exception("removing bad block %s failed", row.key)

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)
