"""Alembic environment for the block index (``omlx db upgrade`` runs it programmatically).

Migrations run on a connection with foreign keys off, because a batch table rebuild
(``render_as_batch``: SQLite cannot ALTER) would otherwise cascade-delete child rows,
and inside one ``BEGIN IMMEDIATE`` transaction, so an upgrade applies whole or not at all.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import make_url

from omlx.adapters.sqlindex.engine import make_engine, writer_engine
from omlx.adapters.sqlindex.models import Base

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


def run_online() -> None:
    db_path = (
        config.attributes.get("db_path")
        or make_url(config.get_main_option("sqlalchemy.url", "")).database
    )
    if not db_path:
        raise RuntimeError("no database: set sqlalchemy.url or the db_path attribute")
    engine = make_engine(db_path, foreign_keys=False, pooled=False)
    try:
        with writer_engine(engine).connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=True,
                transactional_ddl=True,
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
