"""The PostgreSQL engine for a shared index: bounded waits, healthy pooled connections, locks.

A cache must never make a request wait on an unreachable database: connections time
out after ``CONNECT_TIMEOUT_S``, statements after ``STATEMENT_TIMEOUT_MS``, and the pool
pings a connection before lending it, so a restarted server is reconnected, not an error.
Advisory locks (64-bit keys derived from a name) coordinate servers: migrations, eviction,
reconcile, and one live process per server identity.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

CONNECT_TIMEOUT_S = 3
STATEMENT_TIMEOUT_MS = 5000
LOCK_TIMEOUT_MS = 2000
POOL_SIZE = 4  # the engine thread's lookups, the writer thread, reconcile, a spare

MIGRATIONS_LOCK = "omlx:migrations"
EVICTION_LOCK = "omlx:eviction"
RECONCILE_LOCK = "omlx:reconcile"


def require_driver() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise ValueError(
            "a PostgreSQL index needs the psycopg driver: pip install 'omlx[postgres]'"
        ) from None


def make_pg_engine(url: URL, *, pooled: bool = True, timeouts: bool = True) -> Engine:
    """``timeouts=False`` for migrations: a schema change may rightly take longer than a lookup."""
    require_driver()
    options = (
        f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS}"
        if timeouts
        else "-c statement_timeout=0 -c lock_timeout=0"
    )
    kwargs: dict[str, Any] = (
        {"pool_size": POOL_SIZE, "max_overflow": POOL_SIZE, "pool_pre_ping": True}
        if pooled
        else {"poolclass": NullPool}
    )
    return create_engine(
        url,
        connect_args={
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": options,
            "application_name": "omlx",
        },
        **kwargs,
    )


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key for ``name`` (the same on every host)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def try_xact_lock(conn: Connection, name: str) -> bool:
    """Take a lock held until this transaction ends, or return False at once if it is taken."""
    return bool(
        conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": lock_key(name)}).scalar()
    )


@contextlib.contextmanager
def session_lock(engine: Engine, name: str, *, wait: bool) -> Iterator[Connection | None]:
    """Hold a lock for the block on a dedicated connection; None when ``wait`` is False and it is taken.

    Session locks outlive transactions and go when the connection does, so a killed
    process never leaves one behind.
    """
    key = lock_key(name)
    conn = engine.connect()
    try:
        if wait:  # waiting is the point here: no lock or statement timeout
            conn.execute(text("SET lock_timeout = 0"))
            conn.execute(text("SET statement_timeout = 0"))
        fn = "pg_advisory_lock" if wait else "pg_try_advisory_lock"
        got = conn.execute(text(f"SELECT {fn}(:k)"), {"k": key}).scalar()
        conn.commit()
        if wait or got:
            try:
                yield conn
            finally:
                with contextlib.suppress(Exception):
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                    conn.commit()
        else:
            yield None
    finally:
        conn.close()


class ServerIdentityInUse(RuntimeError):
    """Another live process serves under this server identity on this index."""


def hold_identity(engine: Engine, server_id: str) -> Connection:
    """Claim ``server_id`` on the shared index for as long as the returned connection lives.

    Two live servers under one identity would take each other's temporary files for
    leftovers; the second fails fast instead, as a second server on one folder does.
    """
    conn = engine.connect()
    try:
        got = conn.execute(
            text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_key(f"omlx:server:{server_id}")}
        ).scalar()
        conn.commit()
    except BaseException:
        conn.close()
        raise
    if not got:
        conn.close()
        raise ServerIdentityInUse(
            f"another server is running as {server_id!r} on this index; "
            "give each server its own --server-id"
        )
    return conn
