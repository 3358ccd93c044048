"""The SQLite engine: pragmas on every connection, transactions controlled by us, not pysqlite.

pysqlite's own transaction handling defers BEGIN and cannot take the write lock up
front; with ``isolation_level=None`` and a ``begin`` listener (SQLAlchemy's SQLite docs,
"Serializable isolation / Savepoints / Transactional DDL") writers say ``BEGIN IMMEDIATE``
and never hit a lock upgrade deadlock, while readers keep WAL's non-blocking snapshots.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import NullPool

from omlx.adapters.private_files import make_private_dir, touch_private
from omlx.adapters.sqlindex.netfs import refuse_network_filesystem

INDEX_NAME = "index.db"
BUSY_TIMEOUT_MS = 5000
PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
)
# Execution option read by the begin listener: "IMMEDIATE" for writers, else DEFERRED.
BEGIN_MODE = "omlx_sqlite_begin"


def index_path(cache_dir: str | os.PathLike[str]) -> Path:
    return Path(cache_dir).expanduser() / INDEX_NAME


def make_engine(
    db_path: str | os.PathLike[str], *, foreign_keys: bool = True, pooled: bool = True
) -> Engine:
    """An engine on ``db_path`` with WAL, synchronous=NORMAL, foreign keys and a busy timeout.

    ``foreign_keys=False`` is for migrations: a batch table rebuild must not cascade deletes.
    Refuses a file on a network filesystem (``NetworkFilesystemError``, a ``ValueError``).
    """
    path = Path(db_path).expanduser()
    refuse_network_filesystem(path)
    make_private_dir(path.parent)
    touch_private(path)
    kwargs: dict[str, Any] = {} if pooled else {"poolclass": NullPool}
    engine = create_engine(f"sqlite+pysqlite:///{path}", **kwargs)
    pragmas = PRAGMAS if foreign_keys else (*PRAGMAS[:2], "PRAGMA foreign_keys=OFF", PRAGMAS[3])

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        try:
            for pragma in pragmas:
                cursor.execute(pragma)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        options = conn.get_execution_options()
        if options.get("isolation_level") == "AUTOCOMMIT":
            return
        mode = "IMMEDIATE" if options.get(BEGIN_MODE) == "IMMEDIATE" else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def writer_engine(engine: Engine) -> Engine:
    """The same pool and listeners, but every transaction starts with ``BEGIN IMMEDIATE``."""
    return engine.execution_options(**{BEGIN_MODE: "IMMEDIATE"})
