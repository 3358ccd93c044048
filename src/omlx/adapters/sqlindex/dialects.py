"""What differs between SQLite and PostgreSQL in the index's SQL, in one place.

The models, migrations and most queries are shared; these are not: upsert syntax,
the two-argument max, driver placeholders on the request path (``?`` against ``%s``
with ``= ANY``), batched recency (PostgreSQL skips rows another transaction holds, in
key order, so two hosts touching one system prompt never deadlock), and compaction.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, func, text, update
from sqlalchemy.dialects import postgresql, sqlite

from omlx.adapters.sqlindex.models import BlockRow

_BLOCKS = BlockRow.metadata.tables["blocks"]
_B = _BLOCKS.c
BLOCK_COLUMNS = (  # in StoredBlock's field order
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
    _B.kind,
    _B.computed_by,
)
_COLUMNS = ", ".join(c.name for c in BLOCK_COLUMNS)
_ORDER_CHILDREN = "ORDER BY last_access DESC, created_at DESC, key LIMIT"
# Token-granular matching reads KV blocks only; restore-point objects are listed apart.
_KV_CHILD = "kind = 'kv' AND parent_key ="


def _headless_sql(mark: str) -> str:
    """Of a block's most recent children, those recorded without their tokens.

    Only these need reading to be ranked: the nearest-children query ranks every child
    whose tokens are recorded. The newest are taken first (off the index), then filtered,
    so a root with 31k recorded children costs what 16 do.
    """
    return (
        f"SELECT * FROM (SELECT {_COLUMNS} FROM blocks WHERE {_KV_CHILD} {mark} "
        f"{_ORDER_CHILDREN} {mark}) AS recent "
        "WHERE NOT EXISTS (SELECT 1 FROM block_heads AS h WHERE h.key = recent.key) "
        "ORDER BY last_access DESC, created_at DESC, key"
    )


def _nearest_sql(mark: str) -> tuple[str, str]:
    """The children at or below, and above, a head in ``(parent_key, head)`` order, nearest first."""
    cols = ", ".join(f"b.{c.name}" for c in BLOCK_COLUMNS)
    base = (
        f"SELECT {cols}, h.head FROM block_heads AS h JOIN blocks AS b ON b.key = h.key "
        f"WHERE h.parent_key = {mark} AND b.kind = 'kv' AND h.head"
    )
    return (
        f"{base} <= {mark} ORDER BY h.head DESC LIMIT {mark}",
        f"{base} > {mark} ORDER BY h.head ASC LIMIT {mark}",
    )


class SqliteSql:
    name = "sqlite"
    insert = staticmethod(sqlite.insert)
    chunk = 500  # keys per IN (...) list: far below SQLite's variable limit
    children_sql = f"SELECT {_COLUMNS} FROM blocks WHERE {_KV_CHILD} ? {_ORDER_CHILDREN} ?"
    headless_children_sql = _headless_sql("?")
    nearest_sql = _nearest_sql("?")

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def point_children_sql(n: int) -> str:
        marks = ", ".join("?" * n)
        return f"SELECT {_COLUMNS} FROM blocks WHERE parent_key IN ({marks}) AND kind <> 'kv'"

    @staticmethod
    def greatest(a: Any, b: Any) -> Any:
        return func.max(a, b)

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def get_blocks_sql(n: int) -> str:
        return f"SELECT {_COLUMNS} FROM blocks WHERE key IN ({', '.join('?' * n)})"

    @staticmethod
    def get_blocks_params(keys: list[str]) -> Any:
        return keys

    @staticmethod
    def touch(conn: Connection, hits: Mapping[str, float]) -> None:
        stmt = (
            update(_BLOCKS)
            .where(_B.key == bindparam("k"))
            .values(
                last_access=func.max(_B.last_access, bindparam("t")), hit_count=_B.hit_count + 1
            )
        )
        conn.execute(stmt, [{"k": k, "t": t} for k, t in hits.items()])

    @staticmethod
    def vacuum(engine: Engine) -> None:
        """``VACUUM`` (outside any transaction, as SQLite requires) and truncate the WAL."""
        raw = engine.raw_connection()
        try:
            driver = raw.driver_connection
            assert driver is not None
            driver.execute("VACUUM")
            driver.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            raw.close()


_PG_TOUCH = text(
    "UPDATE blocks SET last_access = GREATEST(blocks.last_access, h.t), "
    "hit_count = blocks.hit_count + 1 "
    "FROM (SELECT b.key, hits.t FROM blocks AS b "
    "JOIN unnest(CAST(:keys AS text[]), CAST(:ts AS float8[])) AS hits(k, t) ON b.key = hits.k "
    "ORDER BY b.key FOR UPDATE OF b SKIP LOCKED) AS h "
    "WHERE blocks.key = h.key"
)


class PostgresSql:
    name = "postgresql"
    insert = staticmethod(postgresql.insert)
    chunk = 5000  # keys per = ANY(array): one parameter, any length; chunks bound the reply
    children_sql = f"SELECT {_COLUMNS} FROM blocks WHERE {_KV_CHILD} %s {_ORDER_CHILDREN} %s"
    headless_children_sql = _headless_sql("%s")
    nearest_sql = _nearest_sql("%s")

    @staticmethod
    def point_children_sql(n: int) -> str:
        return f"SELECT {_COLUMNS} FROM blocks WHERE parent_key = ANY(%s) AND kind <> 'kv'"

    @staticmethod
    def greatest(a: Any, b: Any) -> Any:
        return func.greatest(a, b)

    @staticmethod
    def get_blocks_sql(n: int) -> str:
        return f"SELECT {_COLUMNS} FROM blocks WHERE key = ANY(%s)"

    @staticmethod
    def get_blocks_params(keys: list[str]) -> Any:
        return (keys,)

    @staticmethod
    def touch(conn: Connection, hits: Mapping[str, float]) -> None:
        # Recency is advisory: not worth a WAL flush per batch.
        conn.execute(text("SET LOCAL synchronous_commit = off"))
        keys = sorted(hits)
        conn.execute(_PG_TOUCH, {"keys": keys, "ts": [hits[k] for k in keys]})

    @staticmethod
    def vacuum(engine: Engine) -> None:
        """``VACUUM (ANALYZE)`` of the index's tables; it runs beside live servers."""
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in (
                "blocks",
                "block_heads",
                "namespaces",
                "namespace_hosts",
                "weight_digests",
            ):
                conn.execute(text(f"VACUUM (ANALYZE) {table}"))


def sql_for(engine: Engine) -> type[SqliteSql] | type[PostgresSql]:
    if engine.dialect.name == "postgresql":
        return PostgresSql
    if engine.dialect.name == "sqlite":
        return SqliteSql
    raise ValueError(f"unsupported index database {engine.dialect.name!r}")
