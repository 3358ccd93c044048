"""Storage faults while serving (a full disk, a read-only folder, writes failing, an object
store down or refusing us), named and logged once per episode.

A full disk or a read-only cache folder fails every block write the same way: one
WARNING when writes start failing for a reason, one line when a write succeeds again,
and the count in between, instead of a traceback per block. ``fault_of`` recognises the
fault in an ``OSError``, in SQLite's errors (raw or wrapped by SQLAlchemy), and in an
error that names its own (an object store's: its ``fault`` attribute).
"""

from __future__ import annotations

import errno
import logging
import math
import threading
import time

NO_SPACE = "no_space"
READ_ONLY = "read_only"
IO_ERROR = "io_error"  # the disk refuses writes through files already open (SQLite's IOERR)
DAMAGED = "damaged"  # the index file was damaged under the running server
UNREACHABLE = "unreachable"  # an object store down, slow, failing (5xx) or throttling
DENIED = "denied"  # an object store refuses our credentials, or the bucket is gone
# Faults that pass by themselves: a write that fails with one is worth trying again later.
TRANSIENT = frozenset({UNREACHABLE})

_ERRNOS = {
    errno.ENOSPC: NO_SPACE,
    errno.EDQUOT: NO_SPACE,
    errno.EROFS: READ_ONLY,
    errno.EACCES: READ_ONLY,
    errno.EPERM: READ_ONLY,
    errno.EIO: IO_ERROR,
}
_SQLITE = (
    ("database or disk is full", NO_SPACE),
    ("readonly database", READ_ONLY),
    ("read-only", READ_ONLY),
    ("disk i/o error", IO_ERROR),
    ("database disk image is malformed", DAMAGED),
    ("file is not a database", DAMAGED),
)
_WHAT = {
    NO_SPACE: "out of space",
    READ_ONLY: "read-only or not writable",
    IO_ERROR: "writes fail",
    DAMAGED: "its index is damaged",
    UNREACHABLE: "cannot be reached",
    DENIED: "refuses our requests",
}
_UNTIL = {
    NO_SPACE: "until there is room",
    READ_ONLY: "until it is writable again",
    IO_ERROR: "until they work",
    DAMAGED: "until a restart (which moves the damaged index aside and makes a new one)",
    UNREACHABLE: "until it answers",
    DENIED: "until it accepts them",
}
_WHILE = {
    NO_SPACE: "while out of space",
    READ_ONLY: "while not writable",
    IO_ERROR: "while writes failed",
    DAMAGED: "while the index was damaged",
    UNREACHABLE: "while it could not be reached",
    DENIED: "while it refused them",
}


def fault_of(exc: BaseException | None) -> str | None:
    """The fault ``exc`` (or what it wraps) is, e.g. ``no_space``; None when none is known."""
    seen = 0
    while exc is not None and seen < 8:
        named = getattr(exc, "fault", None)
        if named in _WHAT:
            return named
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
    """Logs the start and the end of each run of failures of one kind, for one folder.

    A fault back within ``quiet_s`` of its own last warning (a budget that flaps between
    full and not; a frozen folder whose block files fail with EPERM and whose index fails
    with an I/O error, in turns) is counted silently instead of starting a new episode.
    """

    def __init__(
        self,
        where: str,
        logger: logging.Logger,
        what: str = "blocks are not written",
        quiet_s: float = 60.0,
        again: str = "written again",
        counted: str = "writes dropped",
    ) -> None:
        """``where``: the folder or store, in the log lines; ``what``: what the fault stops;
        ``again``: what the line at its end says, with the count of ``counted``."""
        self.where = where
        self.what = what
        self.quiet_s = quiet_s
        self._log = logger
        self._lock = threading.Lock()
        self._fault: str | None = None
        self._announced = False
        self._last_warning: dict[str, float] = {}
        self._dropped = 0
        self.again, self.counted = again, counted

    @property
    def fault(self) -> str | None:
        return self._fault

    def failed(self, fault: str, exc: BaseException | str) -> None:
        """One write failed for ``fault``; the first of an episode is logged, with ``exc``."""
        now = time.monotonic()
        with self._lock:
            if self._fault == DAMAGED:
                # A damaged index stays damaged until a restart; SQLite reports some of
                # its reads of the garbage as I/O errors: the same episode.
                fault = DAMAGED
            starts = self._fault != fault
            announce = starts and now - self._last_warning.get(fault, -math.inf) >= self.quiet_s
            self._fault = fault
            self._dropped += 1
            if announce:
                self._announced, self._last_warning[fault] = True, now
        if announce:
            self._log.warning(
                "%s: %s (%s); %s %s",
                self.where,
                _WHAT[fault],
                exc if isinstance(exc, str) else _first_line(exc),
                self.what,
                _UNTIL[fault],
            )

    def succeeded(self) -> None:
        with self._lock:
            fault, dropped, announced = self._fault, self._dropped, self._announced
            self._fault, self._dropped, self._announced = None, 0, False
        if fault is not None and announced:
            self._log.warning(
                "%s: %s (%d %s %s)",
                self.where,
                self.again,
                dropped,
                self.counted,
                _WHILE[fault],
            )


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno in errno.errorcode:
        return f"{errno.errorcode[exc.errno]}: {exc.strerror}"
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
