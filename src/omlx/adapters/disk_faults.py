"""Disk faults while serving, named and logged once per episode.

A full disk or a read-only cache folder fails every block write the same way: one
WARNING when writes start failing for a reason, one line when a write succeeds again,
and the count in between, instead of a traceback per block. ``fault_of`` recognises the
fault in an ``OSError`` and in SQLite's errors (raw or wrapped by SQLAlchemy).
"""

from __future__ import annotations

import errno
import logging
import threading

NO_SPACE = "no_space"
READ_ONLY = "read_only"

_ERRNOS = {
    errno.ENOSPC: NO_SPACE,
    errno.EDQUOT: NO_SPACE,
    errno.EROFS: READ_ONLY,
    errno.EACCES: READ_ONLY,
    errno.EPERM: READ_ONLY,
}
_SQLITE = (
    ("database or disk is full", NO_SPACE),
    ("readonly database", READ_ONLY),
    ("read-only", READ_ONLY),
)
_WHAT = {NO_SPACE: "the disk is full", READ_ONLY: "the folder is read-only or not writable"}
_WHILE = {NO_SPACE: "while the disk was full", READ_ONLY: "while it was not writable"}


def fault_of(exc: BaseException | None) -> str | None:
    """``no_space`` or ``read_only`` when ``exc`` (or what it wraps) is one, else None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _ERRNOS:
            return _ERRNOS[exc.errno]
        text = str(exc).lower()
        for marker, fault in _SQLITE:
            if marker in text:
                return fault
        exc = getattr(exc, "orig", None) or exc.__cause__ or exc.__context__
        seen += 1
    return None


class FaultEpisodes:
    """Logs the start and the end of each run of failures of one kind, for one folder."""

    def __init__(self, where: str, logger: logging.Logger, what: str = "blocks are not written") -> None:
        """``where``: the folder, in the log lines; ``what``: what the fault stops."""
        self.where = where
        self.what = what
        self._log = logger
        self._lock = threading.Lock()
        self._fault: str | None = None
        self._dropped = 0

    @property
    def fault(self) -> str | None:
        return self._fault

    def failed(self, fault: str, exc: BaseException) -> None:
        with self._lock:
            first = self._fault != fault
            self._fault = fault
            self._dropped += 1
        if first:
            self._log.warning(
                "%s: %s (%s); %s until it can be written again",
                self.where, _WHAT[fault], _first_line(exc), self.what,
            )

    def succeeded(self) -> None:
        with self._lock:
            fault, dropped = self._fault, self._dropped
            self._fault, self._dropped = None, 0
        if fault is not None:
            self._log.warning(
                "%s: written again (%d writes dropped %s)", self.where, dropped, _WHILE[fault]
            )


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in errno.errorcode:
        return f"{errno.errorcode[exc.errno]}: {exc.strerror}"
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
