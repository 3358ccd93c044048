"""``ReadThroughStore``: a remote block store with local copies on this machine's SSD.

Blocks read from the remote store (or written to it) are kept as files in the folder
store's format and layout under their own byte budget, least recently used first out,
so a server fetches a block once. A read checks the local copy against the row (size
and SHA-256) first; a copy that fails is deleted and the block fetched again. The copies
are a cache of the remote store, never its truth: they are written without fsync (a
torn copy fails its checksum and is refetched) by a thread of their own at a low
priority, between restores (a restore's GETs and checks have the CPU first; a block
waiting for its copy is served from memory), the index does not know them, and
listings, sweeps and deletes answer for the remote store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from omlx.adapters.blockfiles.budget import DiskBudget, SizeBudget
from omlx.adapters.blockfiles.reader import ReadAhead, verified_read
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.private_files import make_private_dir
from omlx.domain.cache.blocks import BlockRead, NamespaceInfo, ReadFailure, StoredBlock

log = logging.getLogger(__name__)

# Bytes of blocks waiting for their local copy; past it a block is not kept this time (its
# next read fetches it again), so a burst of restores never holds much more memory.
COPY_QUEUE_BYTES = 512 * 2**20
COPIER_NICE = 10  # the copies' thread yields the CPU to requests (and to the store's GETs)


class RemoteStore(Protocol):
    """What the read-through tier needs of the store behind it (``S3BlockStore``)."""

    label: str

    def relpath(self, namespace: NamespaceInfo, key: str, checksum: str) -> str: ...
    def write(self, relpath: str, data: bytes) -> None: ...
    def read(self, relpath: str) -> bytes: ...
    def read_buffer(self, relpath: str) -> memoryview: ...
    def delete(self, relpath: str) -> None: ...
    def close(self) -> None: ...
    def iter_relpaths(self) -> Iterator[str]: ...
    def iter_objects(self) -> Iterator[tuple[str, int, float]]: ...
    def file_info(self, relpath: str) -> tuple[int, float] | None: ...
    def check(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LocalCopyStats:
    local_hits: int
    remote_reads: int
    kept: int
    evicted: int
    corrupt_copies: int
    not_kept: int  # blocks the copy queue had no room for
    nbytes: int
    max_bytes: int


class ReadThroughStore:
    """The ``BlockStore`` port: ``remote``'s objects, read through copies in ``local``."""

    def __init__(
        self,
        remote: RemoteStore,
        local: FileBlockStore,
        max_bytes: int,
        *,
        read_threads: int = 16,
    ) -> None:
        self.remote = remote
        self.local = local
        self.label = remote.label
        self.max_bytes = max_bytes
        self._budget = DiskBudget(local.root, max_bytes)
        self._lock = threading.Lock()
        self._copies: OrderedDict[str, int] = OrderedDict()  # relpath -> bytes, oldest first
        self._nbytes = 0
        self._counts = dict.fromkeys(
            ("local_hits", "remote_reads", "kept", "evicted", "corrupt", "not_kept"), 0
        )
        # Copies to write: relpath -> bytes (verified), oldest first, for the copier thread.
        self._queued: OrderedDict[str, bytes | memoryview] = OrderedDict()
        self._queued_bytes = 0
        self._changed = threading.Condition(self._lock)
        self._copier: threading.Thread | None = None
        self._closing = False
        self._batches = 0  # restores reading now: the copier waits for none
        self._reader = ReadAhead(self._read_one, read_threads)
        make_private_dir(local.root)
        self._load()

    # --- the BlockStore port -----------------------------------------------------------

    def relpath(self, namespace: NamespaceInfo, key: str, checksum: str) -> str:
        return self.remote.relpath(namespace, key, checksum)

    def budget(self, max_bytes: int) -> SizeBudget:
        """The remote store's: ``max_bytes`` alone (the copies have a budget of their own)."""
        return SizeBudget(max_bytes)

    def write(self, relpath: str, data: bytes) -> None:
        """The remote PUT (what the row will name), then a local copy: written blocks are
        the ones most likely read next (a conversation's next turn on this server)."""
        self.remote.write(relpath, data)
        self._keep(relpath, data)

    def read(self, relpath: str) -> bytes:
        """The remote object itself (no row to check a local copy against: ``verify``)."""
        return self.remote.read(relpath)

    def read_many(self, blocks: Sequence[StoredBlock]) -> Generator[BlockRead, None, None]:
        with self._lock:
            self._batches += 1
        try:
            yield from self._reader.read_many(blocks)
        finally:
            with self._lock:
                self._batches -= 1
                self._changed.notify_all()

    def close(self) -> None:
        """Stop the reads and the copier; copies not yet written are dropped (only a cache)."""
        self._reader.close()
        with self._lock:
            self._closing = True
            self._queued.clear()
            self._queued_bytes = 0
            copier, self._copier = self._copier, None
            self._changed.notify_all()
        if copier is not None:
            copier.join()
        self.remote.close()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every queued copy is written (tests, a bench); False on timeout."""
        with self._lock:
            return self._changed.wait_for(lambda: not self._queued, timeout)

    def delete(self, relpath: str) -> None:
        self._forget(relpath)
        self.remote.delete(relpath)

    def iter_relpaths(self) -> Iterator[str]:
        return self.remote.iter_relpaths()

    def remove_temp_files(
        self, older_than: float | None = None, *, own_older_than: float | None = None
    ) -> int:
        """The local copies' leftovers (the remote store has none)."""
        return self.local.remove_temp_files(older_than, own_older_than=own_older_than)

    # --- what a sweep needs -------------------------------------------------------------

    def iter_objects(self) -> Iterator[tuple[str, int, float]]:
        return self.remote.iter_objects()

    def file_info(self, relpath: str) -> tuple[int, float] | None:
        return self.remote.file_info(relpath)

    def prune_empty_dirs(self) -> int:
        return self.local.prune_empty_dirs()

    def check(self) -> None:
        self.remote.check()

    def stats(self) -> LocalCopyStats:
        with self._lock:
            c = dict(self._counts)
            nbytes = self._nbytes
        return LocalCopyStats(
            c["local_hits"],
            c["remote_reads"],
            c["kept"],
            c["evicted"],
            c["corrupt"],
            c["not_kept"],
            nbytes,
            self.max_bytes,
        )

    # --- reads ---------------------------------------------------------------------------

    def _read_one(self, block: StoredBlock) -> BlockRead:
        """The local copy if it matches the row, else the remote object (kept if it does)."""
        queued = self._queued.get(block.relpath)
        if queued is not None:  # fetched or written just now, its copy not yet on disk
            read = verified_read(lambda _: queued, block)
            if read.data is not None:
                self._count(local_hits=1)
                return read
        if block.relpath in self._copies:
            local = verified_read(self.local.read, block)
            if local.data is not None:
                self._touch(block.relpath)
                return local
            if local.failure is ReadFailure.MISMATCH:
                log.info("local copy of %s %s; fetched again", block.relpath, local.detail)
                self._count(corrupt=1)
            self._forget(block.relpath)
        self._count(remote_reads=1)
        remote = verified_read(self.remote.read_buffer, block)
        if remote.data is not None:
            self._keep(block.relpath, remote.data)
        return remote

    # --- the local copies: an LRU under a byte budget ----------------------------------

    def _load(self) -> None:
        """Copies a previous run kept, oldest first (their mtime: a hit touches it)."""
        found = sorted(self.local.iter_objects(), key=lambda item: item[2])
        with self._lock:
            for relpath, size, _ in found:
                self._copies[relpath] = size
                self._nbytes += size
        removed = self.local.remove_temp_files()  # a copy cut short by a crash
        self._shrink(0)
        if found or removed:
            log.info(
                "read-through copies of %s: %d blocks, %.1f MB in %s (budget %.1f MB)",
                self.label,
                len(self._copies),
                self._nbytes / 1e6,
                self.local.root,
                self.max_bytes / 1e6,
            )

    def _keep(self, relpath: str, data: bytes | memoryview) -> None:
        """Queue ``data`` for a local copy (the copier writes it); never waits."""
        size = len(data)
        with self._lock:
            if size > self.max_bytes or relpath in self._copies or relpath in self._queued:
                return
            if self._queued_bytes + size > COPY_QUEUE_BYTES:
                self._counts["not_kept"] += 1
                return
            self._queued[relpath] = data
            self._queued_bytes += size
            if self._copier is None:
                self._closing = False
                self._copier = threading.Thread(
                    target=self._copy_queued, name="omlx-read-through-copies", daemon=True
                )
                self._copier.start()
            self._changed.notify_all()

    def _copy_queued(self) -> None:
        """The copier thread: write each queued copy, oldest first, between restores, until
        closed."""
        with contextlib.suppress(OSError, AttributeError):  # Linux: this thread's own nice
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COPIER_NICE)
        while True:
            with self._lock:
                self._changed.wait_for(
                    lambda: (self._queued and not self._batches) or self._closing
                )
                if self._closing:
                    return
                relpath, data = next(iter(self._queued.items()))
            self._write_copy(relpath, data)
            with self._lock:
                if self._queued.pop(relpath, None) is not None:
                    self._queued_bytes -= len(data)
                self._changed.notify_all()

    def _write_copy(self, relpath: str, data: bytes | memoryview) -> None:
        """Copy ``data`` locally, making room first; a copy that fails is only a later refetch."""
        size = len(data)
        self._shrink(size)
        try:
            self.local.write(relpath, data)
        except (OSError, ValueError) as exc:
            log.debug("no local copy of %s: %s", relpath, exc)
            return
        with self._lock:
            if relpath not in self._copies:
                self._copies[relpath] = size
                self._nbytes += size
                self._counts["kept"] += 1

    def _shrink(self, incoming: int) -> None:
        """Delete the least recently used copies until ``incoming`` more bytes fit."""
        while True:
            with self._lock:
                limit = self._budget.limit(self._nbytes)
                if self._nbytes + incoming <= limit or not self._copies:
                    return
                relpath, size = self._copies.popitem(last=False)
                self._nbytes -= size
                self._counts["evicted"] += 1
            with contextlib.suppress(OSError, ValueError):
                self.local.delete(relpath)

    def _touch(self, relpath: str) -> None:
        with self._lock:
            if relpath in self._copies:
                self._copies.move_to_end(relpath)
            self._counts["local_hits"] += 1
        # The file's mtime keeps the order across restarts (atime is often not kept).
        with contextlib.suppress(OSError, ValueError):
            os.utime(self.local.path(relpath))

    def _forget(self, relpath: str) -> None:
        with self._lock:
            size = self._copies.pop(relpath, None)
            if size is not None:
                self._nbytes -= size
            queued = self._queued.pop(relpath, None)
            if queued is not None:
                self._queued_bytes -= len(queued)
        with contextlib.suppress(OSError, ValueError):
            self.local.delete(relpath)

    def _count(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                self._counts[name] += n
