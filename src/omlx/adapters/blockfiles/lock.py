"""One server per cache folder (DESIGN §4 Ownership): ``flock`` on ``<cache_dir>/omlx.lock``.

The kernel drops the lock when the process dies, so a crashed server never leaves a
stale lock; the pid inside is only for the error message. Servers that share the folder
through one PostgreSQL index take the lock *shared*: they coexist, while a server with
an embedded index (which would reconcile their files away) cannot start beside them,
nor they beside it. Where the filesystem has no working ``flock`` (some network
mounts), a shared lock is skipped: the shared index is the coordination there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from pathlib import Path
from types import TracebackType

from omlx.adapters.private_files import PRIVATE_FILE, make_private

LOCK_NAME = "omlx.lock"
log = logging.getLogger(__name__)


class CacheDirLocked(RuntimeError):
    """Another process holds the cache folder's lock."""

    def __init__(self, cache_dir: Path, pid: int | None) -> None:
        who = f"process {pid}" if pid else "another process"
        super().__init__(
            f"cache folder {cache_dir} is in use by {who} (lock file {cache_dir / LOCK_NAME}); "
            "stop that server or give this one another --paged-ssd-cache-dir (servers share "
            "a folder only through one --index-url)"
        )
        self.cache_dir = cache_dir
        self.pid = pid


class CacheDirLock:
    """A non-blocking lock on a cache folder, exclusive unless ``shared``; a context manager."""

    def __init__(self, cache_dir: str | os.PathLike[str], *, shared: bool = False) -> None:
        self.cache_dir = Path(cache_dir).expanduser()
        self.shared = shared
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock at once or raise :class:`CacheDirLocked` naming the holder's pid."""
        if self._fd is not None:
            return
        make_private(self.cache_dir)
        fd = os.open(self.cache_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise CacheDirLocked(self.cache_dir, pid) from None
        except OSError as exc:
            os.close(fd)
            if not self.shared or exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log.warning(
                "no flock on %s (%s); sharing it without a folder lock", self.cache_dir, exc
            )
            return
        if not self.shared:  # one pid for the message; shared holders are many
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        # The file stays: unlinking it would let two processes lock two different inodes.
        if not self.shared:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> CacheDirLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def lock_holder(cache_dir: str | os.PathLike[str]) -> int | None:
    """The pid of the process holding the lock (0 if unknown or shared), or None when nobody holds it."""
    path = Path(cache_dir).expanduser() / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:  # exclusive: a shared holder (a server on a shared index) counts too
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or 0
        except OSError:  # no flock on this filesystem: nobody can hold it
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def is_locked(cache_dir: str | os.PathLike[str]) -> bool:
    """Whether some process (a server) holds the cache folder's lock right now."""
    return lock_holder(cache_dir) is not None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None
