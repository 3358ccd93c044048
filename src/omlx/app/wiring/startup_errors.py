"""Start-up faults of the cache folder and its index, each as one line that says what to do.

The CLI prints a ``StartupError`` as ``omlx: <line>`` and exits 2 (it is a
``RuntimeError``, which ``cli.py`` already reports that way): no traceback for a folder
the user cannot write, a folder on a read-only filesystem, a path under a file, or an
index that cannot be opened.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

_FIX = "choose a writable --paged-ssd-cache-dir, or run without the SSD tier (--no-ssd-cache)"


class StartupError(RuntimeError):
    """A start-up fault the user can fix; its message is the one line to show."""


def _reason(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{name}: {exc.strerror}" if name and exc.strerror else str(exc)


def check_cache_folder(cache_dir: Path) -> None:
    """Make ``cache_dir`` if need be and prove it writable, or raise ``StartupError``."""
    for parent in [cache_dir, *cache_dir.parents]:
        if parent.exists() and not parent.is_dir():
            where = "is" if parent == cache_dir else f"is under {parent}, which is"
            raise StartupError(f"the cache folder {cache_dir} {where} a file, not a folder: {_FIX}")
        if parent.exists():
            break
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(
            f"cannot create the cache folder {cache_dir} ({_reason(exc)}): {_FIX}"
        ) from None
    probe = cache_dir / f".omlx-write-check-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        kind = "is read-only" if exc.errno == errno.EROFS else "is not writable by this user"
        raise StartupError(
            f"the cache folder {cache_dir} {kind} ({_reason(exc)}): {_FIX}"
        ) from None
    os.close(fd)
    probe.unlink(missing_ok=True)


def index_error(index: str, exc: BaseException) -> StartupError:
    """An index that cannot be opened, named, with what to do about it."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    detail = text[0] if text else type(exc).__name__
    return StartupError(
        f"cannot open the index {index} ({detail}): move it aside (a new, empty index is made "
        f"at the next start), or {_FIX.removeprefix('choose a writable --paged-ssd-cache-dir, or ')}"
    )
