"""``SqlBlockIndex``: the ``BlockIndex`` port over SQLite or PostgreSQL, one transaction per use case.

Reads select plain columns (no ORM identity map); the request-path lookup runs driver
SQL, so a request's ~30 keys take about half a millisecond at 100k-1M rows. Dialect
differences live in ``dialects``; a PostgreSQL index that cannot be reached raises
``IndexUnavailable`` (``availability``). Rows about one host's filesystem (model paths,
weight digests) carry that host's name: a shared index serves several hosts.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields

from sqlalchemy import Connection, Engine, delete, func, select, text, tuple_
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from omlx.adapters.sqlindex.availability import AlwaysAvailable, Availability
from omlx.adapters.sqlindex.database import index_path, make_engine, writer_engine
from omlx.adapters.sqlindex.dialects import BLOCK_COLUMNS, PostgresSql, sql_for
from omlx.adapters.sqlindex.migrate import upgrade
from omlx.adapters.sqlindex.models import (
    BlockHeadRow,
    BlockRow,
    ImageRowsRow,
    NamespaceHostRow,
    NamespaceRow,
    WeightDigestRow,
)
from omlx.adapters.sqlindex.urls import SQLITE, display, sqlite_path, sqlite_url, to_url
from omlx.domain.cache.blocks import ImageInfo, NamespaceInfo, NamespaceUsage, StoredBlock
from omlx.domain.cache.keys import CACHE_FORMAT_VERSION
from omlx.domain.cache.ports import EvictionPlan

_BLOCKS = BlockRow.metadata.tables["blocks"]
_B = _BLOCKS.c
_HEADS = BlockHeadRow.__table__
_IMAGES = ImageRowsRow.__table__


def encode_head(tokens: Sequence[int]) -> bytes:
    """Tokens as big-endian uint32s: comparing the bytes compares the token sequences."""
    return struct.pack(f">{len(tokens)}I", *tokens)


def decode_head(head: bytes) -> tuple[int, ...]:
    return struct.unpack(f">{len(head) // 4}I", head)


_PAGE = 256  # eviction candidates per page, read as the plan asks for more


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    """A namespace row with its bookkeeping times; ``info.model_path`` is this host's ("" if none)."""

    info: NamespaceInfo
    created_at: float
    last_used_at: float


class SqlBlockIndex:
    """Implements ``BlockIndex``; safe to share between the engine and writer threads."""

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], float] = time.time,
        *,
        host: str | None = None,
    ) -> None:
        self.engine = engine
        self._clock = clock
        self.host = host if host is not None else socket.gethostname()
        self._sql = sql_for(engine)
        self.shared = self._sql is PostgresSql
        self.label = display(engine.url)
        self._available = (
            Availability(engine, self.label) if self.shared else AlwaysAvailable(self.label)
        )
        self._reader = sessionmaker(engine)
        self._writer = sessionmaker(writer_engine(engine) if not self.shared else engine)

    def _read(self) -> Session:
        return self._reader()

    def _write(self) -> Session:
        return self._writer()

    # --- BlockIndex port -----------------------------------------------------------

    def upsert_namespace(self, namespace: NamespaceInfo) -> None:
        now = self._clock()
        insert = self._sql.insert
        row = {f: getattr(namespace, f) for f in _fields(NamespaceInfo) if f != "model_path"}
        ns = insert(NamespaceRow).values(
            **row, created_at=now, last_used_at=now, format_version=CACHE_FORMAT_VERSION
        )
        ns = ns.on_conflict_do_update(
            index_elements=["digest"],
            set_={
                "model_name": ns.excluded.model_name,
                "last_used_at": ns.excluded.last_used_at,
                # A namespace recorded before specs were (or by the library API) gets one;
                # a caller without one leaves the recorded spec be.
                "block_spec": func.coalesce(
                    func.nullif(ns.excluded.block_spec, ""), NamespaceRow.block_spec
                ),
            },
        )
        where = insert(NamespaceHostRow).values(
            namespace=namespace.digest,
            host=self.host,
            model_path=namespace.model_path,
            last_used_at=now,
        )
        where = where.on_conflict_do_update(
            index_elements=["namespace", "host"],
            set_={
                "model_path": where.excluded.model_path,
                "last_used_at": where.excluded.last_used_at,
            },
        )
        with self._available.guard(), self._write() as session, session.begin():
            session.execute(ns)
            session.execute(where)

    def add_block(
        self, block: StoredBlock, tokens: Sequence[int] = (), image: ImageInfo | None = None
    ) -> bool:
        values = {f: getattr(block, f) for f in _fields(StoredBlock)}
        # First writer wins: a row describes the file its writer made, and is never rewritten.
        stmt = (
            self._sql.insert(_BLOCKS)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["key"])
            .returning(_B.key)
        )
        with self._available.guard(), self._write() as session, session.begin():
            conn = session.connection()
            added = conn.execute(stmt).first() is not None
            if added and tokens:
                conn.execute(
                    _HEADS.insert().values(
                        key=block.key, parent_key=block.parent_key, head=encode_head(tokens)
                    )
                )
            if added and image is not None:
                conn.execute(
                    _IMAGES.insert().values(
                        key=block.key,
                        digest=image.digest,
                        tenant=image.tenant,
                        row_count=image.rows,
                        hidden_size=image.hidden,
                        dtype=image.dtype,
                    )
                )
            return added

    def get_blocks(self, keys: Sequence[str]) -> dict[str, StoredBlock]:
        unique = list(dict.fromkeys(keys))
        found: dict[str, StoredBlock] = {}
        sql = self._sql
        with self._available.guard():
            # The request path: a pooled driver connection, one SELECT, no Result layer.
            raw = self.engine.raw_connection()
            try:
                cursor = raw.cursor()
                for i in range(0, len(unique), sql.chunk):
                    chunk = unique[i : i + sql.chunk]
                    cursor.execute(sql.get_blocks_sql(len(chunk)), sql.get_blocks_params(chunk))
                    for row in cursor.fetchall():
                        found[row[0]] = StoredBlock(*row)
                cursor.close()
            finally:
                raw.close()
        return found

    def children(self, parent_key: str, limit: int, headless: bool = False) -> list[StoredBlock]:
        # The request path too (once per lookup, through ix_blocks_parent_key_last_access).
        sql = self._sql.headless_children_sql if headless else self._sql.children_sql
        with self._available.guard():
            raw = self.engine.raw_connection()
            try:
                cursor = raw.cursor()
                cursor.execute(sql, (parent_key, limit))
                rows = [StoredBlock(*row) for row in cursor.fetchall()]
                cursor.close()
            finally:
                raw.close()
        return rows

    def nearest_children(
        self, parent_key: str, tokens: Sequence[int], limit: int
    ) -> list[tuple[StoredBlock, tuple[int, ...]]]:
        """KV children of ``parent_key`` whose tokens sort nearest ``tokens``, with their tokens.

        The child sharing the longest run with ``tokens`` is a neighbour of ``tokens`` in
        head order, so ``limit`` on each side finds it among any number of siblings.
        """
        head = encode_head(tokens)
        found: list[tuple[StoredBlock, tuple[int, ...]]] = []
        with self._available.guard():
            raw = self.engine.raw_connection()
            try:
                cursor = raw.cursor()
                for sql in self._sql.nearest_sql:
                    cursor.execute(sql, (parent_key, head, limit))
                    for row in cursor.fetchall():
                        found.append((StoredBlock(*row[:-1]), decode_head(bytes(row[-1]))))
                cursor.close()
            finally:
                raw.close()
        return found

    def point_children(self, parent_keys: Sequence[str]) -> list[StoredBlock]:
        """Restore-point objects (kind state or window) hanging from any of ``parent_keys``."""
        unique = list(dict.fromkeys(parent_keys))
        rows: list[StoredBlock] = []
        sql = self._sql
        with self._available.guard():
            raw = self.engine.raw_connection()
            try:
                cursor = raw.cursor()
                for i in range(0, len(unique), sql.chunk):
                    chunk = unique[i : i + sql.chunk]
                    cursor.execute(sql.point_children_sql(len(chunk)), sql.get_blocks_params(chunk))
                    rows.extend(StoredBlock(*row) for row in cursor.fetchall())
                cursor.close()
            finally:
                raw.close()
        return rows

    def old_format_namespaces(self) -> list[str]:
        """Namespaces whose blocks were written in an older block format (to collect)."""
        stmt = select(NamespaceRow.digest).where(NamespaceRow.format_version < CACHE_FORMAT_VERSION)
        with self._available.guard(), self._read() as session:
            return list(session.scalars(stmt))

    def touch(self, hits: Mapping[str, float]) -> None:
        if not hits:
            return
        with self._available.guard(), self._write() as session, session.begin():
            self._sql.touch(session.connection(), hits)

    def remove_blocks(self, keys: Sequence[str]) -> None:
        keys = list(keys)
        with self._available.guard(), self._write() as session, session.begin():
            for i in range(0, len(keys), self._sql.chunk):
                session.execute(delete(BlockRow).where(_B.key.in_(keys[i : i + self._sql.chunk])))

    def total_bytes(self) -> int:
        with self._available.guard(), self._read() as session:
            return int(session.scalar(select(func.coalesce(func.sum(_B.nbytes), 0))) or 0)

    def lru_blocks(self, limit: int) -> list[StoredBlock]:
        stmt = select(*BLOCK_COLUMNS).order_by(_B.last_access, _B.created_at, _B.key).limit(limit)
        with self._available.guard(), self._read() as session:
            return [StoredBlock(*row) for row in session.execute(stmt)]

    def evict(self, plan: EvictionPlan, accessed_before: float | None) -> list[StoredBlock] | None:
        with self._available.guard(), self._write() as session, session.begin():
            conn = session.connection()
            if self.shared:
                from omlx.adapters.sqlindex.postgres import EVICTION_LOCK, try_xact_lock

                if not try_xact_lock(conn, EVICTION_LOCK):
                    return None  # another server is evicting: its plan saw our bytes too
            total = int(conn.scalar(select(func.coalesce(func.sum(_B.nbytes), 0))) or 0)
            victims = plan(total, self._candidates(conn, accessed_before))
            keys = [v.key for v in victims]
            for i in range(0, len(keys), self._sql.chunk):
                conn.execute(delete(BlockRow).where(_B.key.in_(keys[i : i + self._sql.chunk])))
        return victims

    def _candidates(self, conn: Connection, accessed_before: float | None) -> Iterable[StoredBlock]:
        """Blocks oldest first, a page at a time; PostgreSQL locks them and skips locked ones."""
        order = (_B.last_access, _B.created_at, _B.key)
        after: tuple[float, float, str] | None = None
        while True:
            stmt = select(*BLOCK_COLUMNS).order_by(*order).limit(_PAGE)
            if accessed_before is not None:
                stmt = stmt.where(_B.last_access < accessed_before)
            if after is not None:
                stmt = stmt.where(tuple_(*order) > tuple_(*after))
            if self.shared:
                stmt = stmt.with_for_update(skip_locked=True)
            rows = [StoredBlock(*row) for row in conn.execute(stmt)]
            yield from rows
            if len(rows) < _PAGE:
                return
            last = rows[-1]
            after = (last.last_access, last.created_at, last.key)

    def usage(self) -> list[NamespaceUsage]:
        stmt = text(
            "SELECT namespace, model_name, blocks, nbytes, tokens, oldest_access, newest_access, "
            "image_objects, image_bytes FROM cache_usage WHERE blocks > 0 ORDER BY namespace"
        )
        with self._available.guard(), self._read() as session:
            return [NamespaceUsage(*row) for row in session.execute(stmt)]

    def usage_by_computer(self) -> list[tuple[str | None, int, int]]:
        """(``computed_by``, blocks, bytes) per server that computed blocks (None: not
        recorded), most bytes first: each server's share of a shared cold tier."""
        stmt = (
            select(_B.computed_by, func.count(), func.coalesce(func.sum(_B.nbytes), 0))
            .group_by(_B.computed_by)
            .order_by(func.sum(_B.nbytes).desc(), _B.computed_by.nulls_last())
        )
        with self._available.guard(), self._read() as session:
            return [(by, int(n), int(nbytes)) for by, n, nbytes in session.execute(stmt)]

    def all_relpaths(self) -> set[str]:
        with self._available.guard(), self._read() as session:
            return set(session.scalars(select(_B.relpath)))

    # --- beyond the port: admin, start-up and model loading ---------------------------

    def block_count(self) -> int:
        with self._available.guard(), self._read() as session:
            return int(session.scalar(select(func.count()).select_from(BlockRow)) or 0)

    def iter_blocks(self, page: int = 1000) -> Iterator[StoredBlock]:
        """Every block in key order, one short read transaction per page."""
        after = ""
        while True:
            stmt = select(*BLOCK_COLUMNS).where(_B.key > after).order_by(_B.key).limit(page)
            with self._available.guard(), self._read() as session:
                rows = [StoredBlock(*row) for row in session.execute(stmt)]
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1].key

    def namespace_records(self) -> list[NamespaceRecord]:
        h = NamespaceHostRow
        stmt = (
            select(NamespaceRow, h.model_path)
            .outerjoin(h, (h.namespace == NamespaceRow.digest) & (h.host == self.host))
            .order_by(NamespaceRow.model_name, NamespaceRow.digest)
        )
        with self._available.guard(), self._read() as session:
            return [
                NamespaceRecord(
                    NamespaceInfo(
                        r.digest,
                        r.model_name,
                        path or "",
                        r.block_size,
                        r.kv_dtype,
                        r.layer_count,
                        r.block_spec,
                    ),
                    r.created_at,
                    r.last_used_at,
                )
                for r, path in session.execute(stmt)
            ]

    def remove_namespaces(self, digests: Sequence[str]) -> list[StoredBlock]:
        """Drop namespaces and (by cascade) their blocks; returns the removed blocks.

        The caller deletes their files after this commit: rows first, files second.
        """
        digests = list(digests)
        removed: list[StoredBlock] = []
        with self._available.guard(), self._write() as session, session.begin():
            for i in range(0, len(digests), self._sql.chunk):
                chunk = digests[i : i + self._sql.chunk]
                stmt = select(*BLOCK_COLUMNS).where(_B.namespace.in_(chunk))
                if self.shared:
                    stmt = stmt.with_for_update()
                removed.extend(StoredBlock(*row) for row in session.execute(stmt))
                session.execute(delete(NamespaceRow).where(NamespaceRow.digest.in_(chunk)))
        return removed

    def weight_digest_lookup(self, path: str, size: int, mtime: float) -> str | None:
        """The remembered digest of ``path`` on this host if its size and mtime are unchanged."""
        w = WeightDigestRow
        stmt = select(w.digest).where(
            w.host == self.host, w.path == path, w.size == size, w.mtime == mtime
        )
        with self._available.guard(), self._read() as session:
            return session.scalar(stmt)

    def weight_digest_store(self, path: str, size: int, mtime: float, digest: str) -> None:
        values = {"size": size, "mtime": mtime, "digest": digest, "computed_at": self._clock()}
        stmt = self._sql.insert(WeightDigestRow).values(host=self.host, path=path, **values)
        stmt = stmt.on_conflict_do_update(index_elements=["host", "path"], set_=values)
        with self._available.guard(), self._write() as session, session.begin():
            session.execute(stmt)

    @contextlib.contextmanager
    def maintenance_lock(self) -> Iterator[bool]:
        """Whether this process may reconcile now: one at a time across a shared index.

        The embedded index is guarded by the folder lock instead: always True here.
        """
        if not self.shared:
            yield True
            return
        from omlx.adapters.sqlindex.postgres import RECONCILE_LOCK, session_lock

        with self._available.guard(), session_lock(self.engine, RECONCILE_LOCK, wait=False) as held:
            yield held is not None

    def storage_bytes(self) -> int | None:
        """What the database takes on its server (PostgreSQL), None for a file the caller sizes."""
        if not self.shared:
            return None
        with self._available.guard(), self._read() as session:
            return int(session.scalar(text("SELECT pg_database_size(current_database())")) or 0)

    def vacuum(self) -> None:
        """Compact the index: SQLite ``VACUUM`` (needs the folder), PostgreSQL ``VACUUM ANALYZE``."""
        with self._available.guard():
            self._sql.vacuum(self.engine)

    def close(self) -> None:
        self.engine.dispose()


def _fields(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def connect_index(
    target: str | os.PathLike[str] | URL,
    clock: Callable[[], float] = time.time,
    *,
    host: str | None = None,
    migrate: bool = True,
) -> SqlBlockIndex:
    """Migrate the index at ``target`` (a URL, or a SQLite file's path) to head and open it."""
    url = to_url(target)
    if migrate:
        upgrade(url)
    if url.get_backend_name() == SQLITE:
        engine = make_engine(sqlite_path(url))
    else:
        from omlx.adapters.sqlindex.postgres import make_pg_engine

        engine = make_pg_engine(url)
    return SqlBlockIndex(engine, clock=clock, host=host)


def open_index(
    cache_dir: str | os.PathLike[str], clock: Callable[[], float] = time.time
) -> SqlBlockIndex:
    """Migrate ``<cache_dir>/index.db`` to the newest schema and open it."""
    return connect_index(sqlite_url(index_path(cache_dir)), clock)
