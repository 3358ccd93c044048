"""Apply the Alembic migrations to an index; used at server start and by ``omlx db upgrade``.

The target is a SQLite file path or an index URL (``urls.to_url``). The migrations folder
ships inside the package as ``omlx._migrations`` (see pyproject), so an installed wheel
finds it as well as a source checkout.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.pool import NullPool

from omlx.adapters.sqlindex.urls import SQLITE, sqlite_path, to_url

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

FILE_TEMPLATE = "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s"
Target = str | os.PathLike[str] | URL
# The newest migration's revision, so a server starting on an index already there skips
# loading Alembic and its scripts (about half a second). Kept equal to the migrations
# folder's head by tests/integration/test_migrations.py.
HEAD_REVISION = "0019"


def migrations_dir() -> Path:
    return Path(str(resources.files("omlx._migrations")))


def alembic_config(target: Target) -> Config:
    """An Alembic ``Config`` built in code: no alembic.ini needed at run time."""
    from alembic.config import Config

    url = to_url(target)
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("file_template", FILE_TEMPLATE)
    if url.get_backend_name() == SQLITE and url.database != ":memory:":
        path = sqlite_path(url).resolve()
        config.attributes["db_path"] = str(path)
        url = url.set(database=str(path))
    # '%' is Alembic's interpolation character: a password may hold one.
    config.set_main_option("sqlalchemy.url", url.render_as_string(False).replace("%", "%%"))
    config.attributes["url"] = url
    return config


def upgrade(target: Target, revision: str = "head") -> None:
    """Create or migrate the index at ``target`` to ``revision``; a no-op when already there.

    Servers starting together are serialized: SQLite by ``BEGIN IMMEDIATE``, PostgreSQL by
    an advisory lock (``migrations/env.py``).
    """
    url = to_url(target)
    if revision == "head" and _at_revision(url, HEAD_REVISION):
        return
    if url.get_backend_name() == SQLITE:
        sqlite_path(url).parent.mkdir(parents=True, exist_ok=True)
    from alembic import command

    before = current_revision(url)
    command.upgrade(alembic_config(url), revision)
    # One line for what Alembic said in a dozen (its own loggers are quiet at info).
    where = url.render_as_string(hide_password=True)
    if before is None:
        log.info("created the cache index %s (schema %s)", where, current_revision(url))
    else:
        log.info(
            "upgraded the cache index %s from schema %s to %s", where, before, current_revision(url)
        )


def _open_index(url: URL) -> Engine | None:
    """A short-lived engine on the index; None when its SQLite file does not exist."""
    if url.get_backend_name() == SQLITE:
        path = sqlite_path(url)
        if not path.exists():
            return None
        return create_engine(f"sqlite:///{path}", poolclass=NullPool)
    from omlx.adapters.sqlindex.postgres import make_pg_engine

    return make_pg_engine(url, pooled=False)


def _at_revision(url: URL, revision: str) -> bool:
    """Whether the index is already at ``revision``, read with one query (no Alembic)."""
    try:
        engine = _open_index(url)
        if engine is None:
            return False
        try:
            with engine.connect() as conn:
                if not inspect(conn).has_table("alembic_version"):
                    return False
                rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        finally:
            engine.dispose()
    except Exception:  # unreadable here: let Alembic look and say what is wrong
        return False
    return rows == [revision]


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config("sqlite:///:memory:"))
    head = script.get_current_head()
    assert head is not None, "the migrations folder has no revisions"
    return head


def all_revisions() -> list[str]:
    """Every revision, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config("sqlite:///:memory:"))
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def current_revision(target: Target) -> str | None:
    """The revision the index is at; None for a missing file or an empty database."""
    engine = _open_index(to_url(target))
    if engine is None:
        return None
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            from alembic.runtime.migration import MigrationContext

            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
