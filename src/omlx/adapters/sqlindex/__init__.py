"""The block index and stored responses through SQLAlchemy 2.x: SQLite embedded (default)
or PostgreSQL shared. Schema owned by Alembic (``migrations/``); ``connect_index(url)``
migrates and opens.
"""

from __future__ import annotations

from omlx.adapters.sqlindex.database import INDEX_NAME, index_path, make_engine
from omlx.adapters.sqlindex.migrate import all_revisions, current_revision, head_revision, upgrade
from omlx.adapters.sqlindex.netfs import NetworkFilesystemError
from omlx.adapters.sqlindex.repository import (
    NamespaceRecord,
    SqlBlockIndex,
    connect_index,
    open_index,
)
from omlx.adapters.sqlindex.responses import SqlResponseStore
from omlx.adapters.sqlindex.urls import backend, display, sqlite_url, to_url

__all__ = [
    "INDEX_NAME",
    "NamespaceRecord",
    "NetworkFilesystemError",
    "SqlBlockIndex",
    "SqlResponseStore",
    "all_revisions",
    "backend",
    "connect_index",
    "current_revision",
    "display",
    "head_revision",
    "index_path",
    "make_engine",
    "open_index",
    "sqlite_url",
    "to_url",
    "upgrade",
]
