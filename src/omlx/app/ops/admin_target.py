"""What an admin command works on: a cache folder, its index (embedded SQLite or shared) and
its block store (the folder's files, or an object store's bucket).

Resolves ``--cache-dir``, ``--index-url`` and ``--block-store`` the way ``omlx serve``
does, opens the index without creating anything for read-only commands, decides how
careful to be beside live servers, and turns an unreachable database, a refused bucket
or a refused location into one clear line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from sqlalchemy import exc as sa_exc

from omlx.adapters.blockfiles.lock import CacheDirLock, CacheDirLocked
from omlx.adapters.blockfiles.maintenance import LIVE_GRACE_S, ListableStore
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.sqlindex import (
    SqlBlockIndex,
    backend,
    connect_index,
    current_revision,
    display,
    index_path,
    sqlite_url,
)
from omlx.app.settings import Settings, load_settings
from omlx.domain.cache.ports import IndexUnavailable

F = TypeVar("F", bound=Callable[..., Any])


def _server_settings(param: click.Parameter) -> Settings:
    try:
        return load_settings()
    except ValueError as exc:  # a bad OMLX_* value: say which, as omlx serve would
        raise click.BadParameter(str(exc), param=param) from None


def _server_cache_dir(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
    # Unset: the server's own paged_ssd_cache_dir (config/omlx.toml, OMLX_PAGED_SSD_CACHE_DIR).
    return value if value is not None else _server_settings(param).cache_dir


def _server_index_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # Unset: the server's own index_url (OMLX_INDEX_URL); empty there means <cache-dir>/index.db.
    return value if value is not None else _server_settings(param).index_url or None


cache_dir_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    envvar="OMLX_CACHE_DIR",
    show_envvar=True,
    callback=_server_cache_dir,
    help="The cache folder (block files, and index.db unless --index-url is given); "
    "default: the server's paged_ssd_cache_dir.",
)


def _server_block_store(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    # Unset: the server's own block_store (OMLX_BLOCK_STORE); empty means the folder's files.
    return value if value is not None else _server_settings(param).block_store


block_store_option = click.option(
    "--block-store",
    default=None,
    callback=_server_block_store,
    help="The blocks' object store, when not the cache folder: s3://bucket/prefix (keys and "
    "endpoint from the AWS_* variables or ~/.aws); default: the server's block_store.",
)
index_url_option = click.option(
    "--index-url",
    default=None,
    callback=_server_index_url,
    help="The index, when not <cache-dir>/index.db: postgresql+psycopg://… (a shared index); "
    "default: the server's index_url.",
)


@dataclass(frozen=True)
class Target:
    cache_dir: Path
    url: str
    block_store: str = ""  # an object store's URL; "": the folder's files

    @classmethod
    def of(cls, cache_dir: Path, index_url: str | None, block_store: str = "") -> Target:
        url = index_url or sqlite_url(index_path(cache_dir))
        return cls(cache_dir.expanduser(), url, block_store)

    def open_store(self) -> ListableStore:
        """The blocks' store itself: the folder's files, or the bucket (its objects, not a
        server's local copies of them)."""
        if not self.block_store:
            return FileBlockStore(self.cache_dir)
        from omlx.adapters.objectstore import S3BlockStore, S3Location

        return S3BlockStore(S3Location.parse(self.block_store))

    @property
    def shared(self) -> bool:
        return backend(self.url) == "postgresql"

    @property
    def label(self) -> str:
        return display(self.url) if self.shared else str(index_path(self.cache_dir))

    def existing_index(self) -> SqlBlockIndex | None:
        """The index if there is one (migrated to head), else None: read-only commands create nothing."""
        if not self.shared and not index_path(self.cache_dir).exists():
            return None
        if self.shared and current_revision(self.url) is None:
            return None
        return self.open_index()

    def open_index(self) -> SqlBlockIndex:
        return connect_index(self.url)


@contextmanager
def owned_or_shared(target: Target, grace: float = LIVE_GRACE_S) -> Iterator[float | None]:
    """Own the folder if no server does; yields the grace period for young files and rows.

    A shared index is never owned: servers on other hosts hold no lock here.
    """
    if target.shared:
        click.echo(
            f"shared index: files and rows younger than {grace:.0f} s are left alone", err=True
        )
        yield grace
        return
    lock = CacheDirLock(target.cache_dir)
    try:
        lock.acquire()
    except CacheDirLocked as exc:
        click.echo(
            f"server running (pid {exc.pid or '?'}): files written and blocks used in the "
            f"last {grace:.0f} s are left alone",
            err=True,
        )
    if not lock.held:
        yield grace
        return
    try:
        yield None
    finally:
        lock.release()


def friendly_errors(command: F) -> F:
    """An unreachable database or a refused location: one line and exit 1, no traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except IndexUnavailable as exc:
            raise click.ClickException(str(exc)) from None
        except sa_exc.OperationalError as exc:
            first = str(exc.orig or exc).strip().splitlines()[0]
            raise click.ClickException(f"cannot reach the index: {first}") from None
        except ValueError as exc:  # a bad URL, a missing driver, SQLite on a network share
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            if getattr(exc, "fault", None) is None:  # not an object store's refusal or outage
                raise
            raise click.ClickException(f"object store: {exc}") from None

    return wrapper  # type: ignore[return-value]
