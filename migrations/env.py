"""Alembic environment for the block index (``omlx db upgrade`` runs it programmatically).

SQLite: migrations run on a connection with foreign keys off, because a batch table
rebuild (``render_as_batch``: SQLite cannot ALTER) would otherwise cascade-delete child
rows, and inside one ``BEGIN IMMEDIATE`` transaction, so an upgrade applies whole or not
at all and two servers starting together take turns.

PostgreSQL: one transaction too (its DDL is transactional), taken under a session
advisory lock, so servers starting together on one database migrate one after the other
and the later ones find the schema at head.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.engine import make_url

from omlx.adapters.sqlindex.models import Base
from omlx.adapters.sqlindex.urls import SQLITE

config = context.config
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        render_as_batch=True,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_sqlite(db_path: str) -> None:
    from omlx.adapters.sqlindex.database import make_engine, writer_engine

    engine = make_engine(db_path, foreign_keys=False, pooled=False)
    try:
        with writer_engine(engine).connect() as connection:
            _migrate(connection)
    finally:
        engine.dispose()


def run_postgresql(url) -> None:
    from omlx.adapters.sqlindex.postgres import MIGRATIONS_LOCK, make_pg_engine, session_lock

    engine = make_pg_engine(url, pooled=False, timeouts=False)
    try:
        with session_lock(engine, MIGRATIONS_LOCK, wait=True) as connection:
            assert connection is not None
            _migrate(connection)
            connection.commit()
    finally:
        engine.dispose()


def run_online() -> None:
    url = config.attributes.get("url") or make_url(config.get_main_option("sqlalchemy.url", ""))
    if url.get_backend_name() == SQLITE:
        db_path = config.attributes.get("db_path") or url.database
        if not db_path:
            raise RuntimeError("no database: set sqlalchemy.url or the db_path attribute")
        run_sqlite(db_path)
    else:
        run_postgresql(url)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
