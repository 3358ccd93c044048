"""The block index and stored responses in SQLite through SQLAlchemy 2.x; schema owned by
Alembic (``migrations/``)."""

from __future__ import annotations

from omlx.adapters.sqlindex.engine import INDEX_NAME, index_path, make_engine
from omlx.adapters.sqlindex.migrate import current_revision, head_revision, upgrade
from omlx.adapters.sqlindex.repository import NamespaceRecord, SqlBlockIndex, open_index
from omlx.adapters.sqlindex.responses import SqlResponseStore

__all__ = [
    "INDEX_NAME",
    "NamespaceRecord",
    "SqlBlockIndex",
    "SqlResponseStore",
    "current_revision",
    "head_revision",
    "index_path",
    "make_engine",
    "open_index",
    "upgrade",
]
