"""Where the index lives: a ``sqlite:///…`` file (the embedded default) or a PostgreSQL URL.

One string names the database everywhere (settings, ``--index-url``, Alembic). A bare
path means a SQLite file; URLs are SQLAlchemy's, e.g. ``postgresql+psycopg://host/omlx``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def sqlite_url(db_path: str | os.PathLike[str]) -> str:
    return f"sqlite:///{Path(db_path).expanduser().resolve()}"


def to_url(target: str | os.PathLike[str] | URL) -> URL:
    """``target`` as a SQLAlchemy URL: URLs as they are, paths as SQLite files."""
    if isinstance(target, URL):
        return target
    text = os.fspath(target)
    if not _SCHEME.match(text):
        text = sqlite_url(text)
    url = make_url(text)
    if url.get_backend_name() == POSTGRESQL and url.drivername == POSTGRESQL:
        url = url.set(drivername="postgresql+psycopg")  # psycopg 3: the driver omlx ships for
    if url.get_backend_name() not in (SQLITE, POSTGRESQL):
        raise ValueError(
            f"index URL {display(url)!r}: only sqlite:///PATH and postgresql+psycopg://… are supported"
        )
    return url


def backend(target: str | os.PathLike[str] | URL) -> str:
    return to_url(target).get_backend_name()


def sqlite_path(url: URL) -> Path:
    """The file of a ``sqlite:///`` URL (in-memory databases are not an index)."""
    if not url.database or url.database == ":memory:":
        raise ValueError("a SQLite index needs a file: sqlite:///PATH")
    return Path(url.database).expanduser()


def display(target: str | URL) -> str:
    """The URL with its password hidden, for logs and messages."""
    url = target if isinstance(target, URL) else make_url(target)
    return url.render_as_string(hide_password=True)
