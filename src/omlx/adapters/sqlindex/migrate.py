"""Apply the Alembic migrations to an index file; used at server start and by ``omlx db upgrade``.

The migrations folder ships inside the package as ``omlx._migrations`` (see pyproject),
so an installed wheel finds it as well as a source checkout.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

FILE_TEMPLATE = "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s"


def migrations_dir() -> Path:
    return Path(str(resources.files("omlx._migrations")))


def alembic_config(db_path: str | os.PathLike[str]) -> Config:
    """An Alembic ``Config`` built in code: no alembic.ini needed at run time."""
    path = Path(db_path).expanduser().resolve()
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("file_template", FILE_TEMPLATE)
    config.set_main_option("sqlalchemy.url", f"sqlite:///{path}")
    config.attributes["db_path"] = str(path)
    return config


def upgrade(db_path: str | os.PathLike[str], revision: str = "head") -> None:
    """Create or migrate the index at ``db_path`` to ``revision``; a no-op when already there."""
    Path(db_path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(db_path), revision)


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config(":memory:"))
    head = script.get_current_head()
    assert head is not None, "the migrations folder has no revisions"
    return head


def current_revision(db_path: str | os.PathLike[str]) -> str | None:
    """The revision the index is at; None for a missing or empty file."""
    path = Path(db_path).expanduser()
    if not path.exists():
        return None
    engine = create_engine(f"sqlite:///{path}", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
