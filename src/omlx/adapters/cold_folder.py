"""A cache folder opened for the cold tier, wired one way for the server and the library.

The folder lock, the index (embedded SQLite, or a PostgreSQL one shared by servers), the
block store (the folder's files, or an object store's bucket with local copies under
the folder), and the one writer thread with its budget and batched recency: what
``app.bootstrap`` opens for every model of a server and ``omlx.cache``'s ``DiskTier`` for
one library namespace. Both may import it; it imports only adapters and the domain. Each
caller words a locked folder, an unreachable index or a refused bucket its own way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omlx.adapters.blockfiles import BlockWriter, CacheDirLock, FileBlockStore
from omlx.adapters.blockfiles.maintenance import ListableStore
from omlx.adapters.private_files import make_private
from omlx.adapters.sqlindex import SqlBlockIndex, backend, connect_index, index_path, sqlite_url
from omlx.adapters.sqlindex.damaged import is_damaged, set_aside
from omlx.domain.cache.cold_tier import RecencyBuffer

log = logging.getLogger(__name__)

WRITER_TICK_S = 1.0  # how often an idle writer wakes to flush recency or see close()
READ_THROUGH_DEFAULT_BYTES = 20 * 10**9  # local copies of an object store's blocks


def index_url_of(cache_dir: Path, index_url: str | None) -> str:
    """The index a folder's blocks are recorded in: ``index_url``, else ``<cache_dir>/index.db``."""
    return index_url or sqlite_url(index_path(cache_dir))


def is_shared(url: str) -> bool:
    """Whether servers share the index (PostgreSQL), so the folder lock is a shared one."""
    return backend(url) == "postgresql"


@dataclass(frozen=True, slots=True)
class ColdFolder:
    """A locked cache folder with its index connected and its store ready.

    The adapters themselves, not their ports: the server also uses what only they have
    (the index's database for stored responses, weight digests, the maintenance lock).
    """

    dir: Path
    index: SqlBlockIndex
    store: ListableStore
    shared: bool
    lock: CacheDirLock
    block_store: str = ""  # the object store's URL; "": the folder's own files

    @property
    def store_url(self) -> str:
        """Where the blocks are: the object store's URL, else the folder."""
        return self.block_store or str(self.dir)

    def close(self) -> None:
        """Stop the store's read threads, close the index, unlock (after the writer drained)."""
        try:
            self.store.close()
            self.index.close()
        finally:
            self.lock.release()


def open_cold_folder(
    cache_dir: Path,
    index_url: str | None,
    *,
    writer_id: str = "",
    block_store: str = "",
    read_through_bytes: int = READ_THROUGH_DEFAULT_BYTES,
) -> ColdFolder:
    """Lock ``cache_dir`` (exclusive, or shared beside a shared index) and connect its index;
    a damaged SQLite index is moved aside and a new one made (``sqlindex.damaged``).

    ``block_store``: an ``s3://bucket/prefix`` whose objects hold the blocks, with up to
    ``read_through_bytes`` of local copies in the folder (which keeps the lock, and the
    index unless ``index_url`` names a shared one); empty: the folder's own files.

    Raises ``CacheDirLocked`` when another owner holds the folder, the index's own error
    when it cannot be reached, and ValueError for a bad ``block_store`` or no credentials
    for it (the lock is released then). ``writer_id`` names this process's temporary
    files among the servers sharing the folder. Nothing here asks the object store:
    the caller checks it (``store.check()``) and words the answer.
    """
    make_private(cache_dir)
    url = index_url_of(cache_dir, index_url)
    shared = is_shared(url)
    lock = CacheDirLock(cache_dir, shared=shared)
    lock.acquire()
    try:
        index = _connect_or_set_aside(url, None if shared else index_path(cache_dir))
    except BaseException:
        lock.release()
        raise
    try:
        store = open_block_store(cache_dir, block_store, writer_id, read_through_bytes)
    except BaseException:
        index.close()
        lock.release()
        raise
    return ColdFolder(cache_dir, index, store, shared, lock, block_store)


def open_block_store(
    cache_dir: Path,
    block_store: str = "",
    writer_id: str = "",
    read_through_bytes: int = READ_THROUGH_DEFAULT_BYTES,
) -> ListableStore:
    """The folder's files, or the object store ``block_store`` names read through copies
    in the folder; ValueError for a setting that names neither."""
    if not block_store:
        return FileBlockStore(cache_dir, writer_id=writer_id)
    from omlx.adapters.objectstore import is_object_store_url, open_object_store

    if not is_object_store_url(block_store):
        raise ValueError(
            f"block_store {block_store!r}: expected s3://bucket/prefix (empty: the cache folder)"
        )
    return open_object_store(block_store, cache_dir, read_through_bytes)


def _connect_or_set_aside(url: str, db: Path | None) -> SqlBlockIndex:
    """The index at ``url``; a damaged SQLite file ``db`` is moved aside for a new one."""
    from sqlalchemy import exc as sa_exc

    try:
        return connect_index(url)
    except sa_exc.DatabaseError as exc:
        if db is None or not is_damaged(exc):
            raise
        moved = set_aside(db)
        log.warning(
            "the index %s is damaged (%s): moved to %s; starting with a new, empty index "
            "(cached prefixes are computed again; the old block files are reclaimed)",
            db,
            str(exc.orig or exc).strip().splitlines()[0],
            moved,
        )
        return connect_index(url)


@dataclass(frozen=True, slots=True)
class ColdWriter:
    """The folder's one block writer and the recency buffer it flushes on its thread."""

    writer: BlockWriter
    recency: RecencyBuffer

    def close(self, timeout: float = 30.0) -> None:
        """Drain the writer, then flush recency so LRU order survives."""
        try:
            self.writer.close(timeout)
        finally:
            self.recency.flush()


def start_cold_writer(
    folder: ColdFolder,
    max_bytes: int,
    *,
    is_pinned: Callable[[str], bool],
    lease: float,
    tick_interval: float = WRITER_TICK_S,
) -> ColdWriter:
    """Start the writer thread under a ``max_bytes`` budget; ``lease``: with a shared index,
    never evict what any server used or wrote that many seconds ago or later."""
    recency = RecencyBuffer(folder.index)
    writer = BlockWriter(
        folder.store,
        folder.index,
        folder.store.budget(max_bytes),  # a bucket's is max_bytes alone
        is_pinned=is_pinned,
        tick=recency.maybe_flush,
        shared=folder.shared,
        lease=lease,
        tick_interval=tick_interval,
    )
    return ColdWriter(writer, recency)
