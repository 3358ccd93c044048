"""A damaged SQLite index file, recognised and moved aside so a new one can be made.

The index is bookkeeping over the block files: losing it costs the cache, not data the
user wrote. So a file SQLite reports as damaged ("database disk image is malformed",
"file is not a database") is renamed beside itself, with its WAL and shared-memory
files, for a person to inspect, and the server starts with a new, empty index; the
start-up reconcile then reclaims the block files no row names.
"""

from __future__ import annotations

import time
from pathlib import Path

_MARKERS = ("database disk image is malformed", "file is not a database")


def is_damaged(exc: BaseException) -> bool:
    """Whether ``exc`` (SQLAlchemy's, or sqlite3's it wraps) says the file is damaged."""
    text = f"{exc} {getattr(exc, 'orig', '')}".lower()
    return any(marker in text for marker in _MARKERS)


def set_aside(db: Path, now: float | None = None) -> Path:
    """Rename ``db`` (and its ``-wal``/``-shm``) to ``<db>.damaged-<UTC time>``; the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = db.with_name(f"{db.name}.damaged-{stamp}")
    for suffix in ("-wal", "-shm"):
        extra = db.with_name(db.name + suffix)
        if extra.exists():
            extra.rename(target.with_name(target.name + suffix))
    db.rename(target)
    return target
