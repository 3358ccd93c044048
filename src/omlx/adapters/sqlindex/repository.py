"""``SqlBlockIndex``: the ``BlockIndex`` port over SQLite, one transaction per use case.

Reads select plain columns (no ORM identity map); the request-path lookup runs driver
SQL, so a request's ~30 keys take about half a millisecond at 100k-1M rows.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields

from sqlalchemy import Engine, bindparam, delete, func, select, text, update
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session, sessionmaker

from omlx.adapters.sqlindex.engine import index_path, make_engine, writer_engine
from omlx.adapters.sqlindex.migrate import upgrade
from omlx.adapters.sqlindex.models import BlockRow, NamespaceRow, WeightDigestRow
from omlx.domain.blocks import NamespaceInfo, NamespaceUsage, StoredBlock

_CHUNK = 500  # keys per IN (...) list: far below SQLite's variable limit
_BLOCKS = BlockRow.metadata.tables["blocks"]
_B = _BLOCKS.c
_BLOCK_COLUMNS = (  # in StoredBlock's field order
    _B.key,
    _B.namespace,
    _B.parent_key,
    _B.token_count,
    _B.nbytes,
    _B.checksum,
    _B.relpath,
    _B.created_at,
    _B.last_access,
    _B.hit_count,
)
_TOUCH = (
    update(_BLOCKS)
    .where(_B.key == bindparam("k"))
    .values(last_access=func.max(_B.last_access, bindparam("t")), hit_count=_B.hit_count + 1)
)


def _fields(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


@functools.lru_cache(maxsize=64)
def _get_blocks_sql(n: int) -> str:
    columns = ", ".join(c.name for c in _BLOCK_COLUMNS)
    return f"SELECT {columns} FROM blocks WHERE key IN ({', '.join('?' * n)})"


_CHILDREN_SQL = (
    f"SELECT {', '.join(c.name for c in _BLOCK_COLUMNS)} FROM blocks WHERE parent_key = ? "
    "ORDER BY last_access DESC, created_at DESC, key LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    """A namespace row with its bookkeeping times."""

    info: NamespaceInfo
    created_at: float
    last_used_at: float


class SqlBlockIndex:
    """Implements ``BlockIndex``; safe to share between the engine and writer threads."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self._clock = clock
        self._reader = sessionmaker(engine)
        self._writer = sessionmaker(writer_engine(engine))

    def _read(self) -> Session:
        return self._reader()

    def _write(self) -> Session:
        return self._writer()

    # --- BlockIndex port -----------------------------------------------------------

    def upsert_namespace(self, namespace: NamespaceInfo) -> None:
        now = self._clock()
        row = {f: getattr(namespace, f) for f in _fields(NamespaceInfo)}
        stmt = insert(NamespaceRow).values(**row, created_at=now, last_used_at=now)
        stmt = stmt.on_conflict_do_update(
            index_elements=["digest"],
            set_={
                "model_name": stmt.excluded.model_name,
                "model_path": stmt.excluded.model_path,
                "last_used_at": stmt.excluded.last_used_at,
            },
        )
        with self._write() as session, session.begin():
            session.execute(stmt)

    def add_block(self, block: StoredBlock) -> None:
        values = {f: getattr(block, f) for f in _fields(StoredBlock)}
        stmt = insert(BlockRow).values(**values)
        # The file was just rewritten: the row must describe the file now on disk.
        stmt = stmt.on_conflict_do_update(
            index_elements=["key"],
            set_={
                "nbytes": stmt.excluded.nbytes,
                "checksum": stmt.excluded.checksum,
                "relpath": stmt.excluded.relpath,
                "last_access": func.max(_B.last_access, stmt.excluded.last_access),
            },
        )
        with self._write() as session, session.begin():
            session.execute(stmt)

    def get_blocks(self, keys: Sequence[str]) -> dict[str, StoredBlock]:
        unique = list(dict.fromkeys(keys))
        found: dict[str, StoredBlock] = {}
        # The request path: a pooled driver connection (pragmas applied by the connect
        # listener) in SQLite's autocommit, one SELECT, no Result layer: ~40% faster.
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            for i in range(0, len(unique), _CHUNK):
                chunk = unique[i : i + _CHUNK]
                for row in cursor.execute(_get_blocks_sql(len(chunk)), chunk):
                    found[row[0]] = StoredBlock(*row)
            cursor.close()
        finally:
            raw.close()
        return found

    def children(self, parent_key: str, limit: int) -> list[StoredBlock]:
        # The request path too (once per lookup, through ix_blocks_parent_key): driver SQL.
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            rows = [StoredBlock(*row) for row in cursor.execute(_CHILDREN_SQL, (parent_key, limit))]
            cursor.close()
        finally:
            raw.close()
        return rows

    def touch(self, hits: Mapping[str, float]) -> None:
        if not hits:
            return
        params = [{"k": key, "t": at} for key, at in hits.items()]
        with self._write() as session, session.begin():
            session.connection().execute(_TOUCH, params)

    def remove_blocks(self, keys: Sequence[str]) -> None:
        keys = list(keys)
        with self._write() as session, session.begin():
            for i in range(0, len(keys), _CHUNK):
                session.execute(delete(BlockRow).where(_B.key.in_(keys[i : i + _CHUNK])))

    def total_bytes(self) -> int:
        with self._read() as session:
            return int(session.scalar(select(func.coalesce(func.sum(_B.nbytes), 0))) or 0)

    def lru_blocks(self, limit: int) -> list[StoredBlock]:
        stmt = select(*_BLOCK_COLUMNS).order_by(_B.last_access, _B.created_at, _B.key).limit(limit)
        with self._read() as session:
            return [StoredBlock(*row) for row in session.execute(stmt)]

    def usage(self) -> list[NamespaceUsage]:
        stmt = text(
            "SELECT namespace, model_name, blocks, nbytes, tokens, oldest_access, newest_access "
            "FROM cache_usage WHERE blocks > 0 ORDER BY namespace"
        )
        with self._read() as session:
            return [NamespaceUsage(*row) for row in session.execute(stmt)]

    def all_relpaths(self) -> set[str]:
        with self._read() as session:
            return set(session.scalars(select(_B.relpath)))

    # --- beyond the port: admin, start-up and model loading ---------------------------

    def block_count(self) -> int:
        with self._read() as session:
            return int(session.scalar(select(func.count()).select_from(BlockRow)) or 0)

    def iter_blocks(self, page: int = 1000) -> Iterator[StoredBlock]:
        """Every block in key order, one short read transaction per page."""
        after = ""
        while True:
            stmt = select(*_BLOCK_COLUMNS).where(_B.key > after).order_by(_B.key).limit(page)
            with self._read() as session:
                rows = [StoredBlock(*row) for row in session.execute(stmt)]
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1].key

    def namespace_records(self) -> list[NamespaceRecord]:
        with self._read() as session:
            rows = session.scalars(select(NamespaceRow).order_by(NamespaceRow.model_name)).all()
            return [
                NamespaceRecord(
                    NamespaceInfo(
                        r.digest,
                        r.model_name,
                        r.model_path,
                        r.block_size,
                        r.kv_dtype,
                        r.layer_count,
                    ),
                    r.created_at,
                    r.last_used_at,
                )
                for r in rows
            ]

    def remove_namespaces(self, digests: Sequence[str]) -> list[StoredBlock]:
        """Drop namespaces and (by cascade) their blocks; returns the removed blocks.

        The caller deletes their files after this commit: rows first, files second.
        """
        digests = list(digests)
        removed: list[StoredBlock] = []
        with self._write() as session, session.begin():
            for i in range(0, len(digests), _CHUNK):
                chunk = digests[i : i + _CHUNK]
                stmt = select(*_BLOCK_COLUMNS).where(_B.namespace.in_(chunk))
                removed.extend(StoredBlock(*row) for row in session.execute(stmt))
                session.execute(delete(NamespaceRow).where(NamespaceRow.digest.in_(chunk)))
        return removed

    def weight_digest_lookup(self, path: str, size: int, mtime: float) -> str | None:
        """The remembered digest of ``path`` if its size and mtime are still the same."""
        stmt = select(WeightDigestRow.digest).where(
            WeightDigestRow.path == path,
            WeightDigestRow.size == size,
            WeightDigestRow.mtime == mtime,
        )
        with self._read() as session:
            return session.scalar(stmt)

    def weight_digest_store(self, path: str, size: int, mtime: float, digest: str) -> None:
        values = {
            "path": path,
            "size": size,
            "mtime": mtime,
            "digest": digest,
            "computed_at": self._clock(),
        }
        stmt = insert(WeightDigestRow).values(**values)
        stmt = stmt.on_conflict_do_update(index_elements=["path"], set_=values)
        with self._write() as session, session.begin():
            session.execute(stmt)

    def vacuum(self) -> None:
        """``VACUUM`` (outside any transaction, as SQLite requires) and truncate the WAL."""
        raw = self.engine.raw_connection()
        try:
            sqlite = raw.driver_connection
            assert sqlite is not None
            sqlite.execute("VACUUM")
            sqlite.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            raw.close()

    def close(self) -> None:
        self.engine.dispose()


def open_index(
    cache_dir: str | os.PathLike[str], clock: Callable[[], float] = time.time
) -> SqlBlockIndex:
    """Migrate ``<cache_dir>/index.db`` to the newest schema and open it."""
    path = index_path(cache_dir)
    upgrade(path)
    return SqlBlockIndex(make_engine(path), clock=clock)
