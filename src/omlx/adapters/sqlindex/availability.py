"""A shared index that cannot be reached is a miss, not an error: fail fast while it is down.

Each call that finds PostgreSQL down (connection refused, a dropped connection, a
statement timeout) raises ``IndexUnavailable``; for ``RETRY_AFTER_S`` after that, calls
raise it at once instead of waiting on another connect timeout. One warning when the
index goes away, one line when it answers again: no traceback per request.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from omlx.adapters.disk_faults import fault_of
from omlx.domain.cache.ports import IndexUnavailable

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1.0


class Availability:
    """The guard around every call of a server-backed index."""

    def __init__(self, engine: Engine, label: str, retry_after: float = RETRY_AFTER_S) -> None:
        dbapi = engine.dialect.loaded_dbapi
        self._errors: tuple[type[BaseException], ...] = (
            sa_exc.OperationalError,
            sa_exc.InterfaceError,
            dbapi.OperationalError,  # the request path's driver calls raise these unwrapped
            dbapi.InterfaceError,
        )
        self._label = label
        self._retry_after = retry_after
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._reason = ""

    @property
    def down(self) -> bool:
        return bool(self._reason)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        with self._lock:
            if time.monotonic() < self._down_until:
                raise IndexUnavailable(self._reason)
        try:
            yield
        except self._errors as exc:
            if _timed_out(exc):  # the server answers, a statement waited too long: no outage
                log.warning("index %s: %s", self._label, _first_line(exc))
                raise IndexUnavailable(f"index {self._label}: {_first_line(exc)}") from exc
            reason = f"index {self._label} unreachable: {_first_line(exc)}"
            with self._lock:
                first = not self._reason
                self._reason = reason
                self._down_until = time.monotonic() + self._retry_after
            if first:
                log.warning("%s; lookups miss and block writes drop until it answers", reason)
            raise IndexUnavailable(reason) from exc
        with self._lock:
            recovered, self._reason = bool(self._reason), ""
        if recovered:
            log.warning("index %s answers again", self._label)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _timed_out(exc: BaseException) -> bool:
    """A statement or lock timeout (SQLSTATE 57014, 55P03), not a lost connection."""
    orig = getattr(exc, "orig", None) or exc
    return getattr(orig, "sqlstate", None) in ("57014", "55P03")


class AlwaysAvailable:
    """The embedded SQLite index: its errors are real errors, raised as they are, except a
    full disk, a read-only folder, failing writes or a damaged file, which are
    ``IndexUnavailable`` (lookups miss, writes are deferred or dropped; the block writer
    logs the episode once)."""

    down = False

    def __init__(self, label: str = "index.db") -> None:
        self._label = label

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except (sa_exc.DBAPIError, sqlite3.Error) as exc:  # the request path's raw driver calls too
            fault = fault_of(exc)
            if fault is None:
                raise
            raise IndexUnavailable(
                f"index {self._label}: {fault.replace('_', ' ')}: {_first_line(exc)}"
            ) from exc
