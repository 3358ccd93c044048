"""Refuse a SQLite index on a network filesystem: SQLite's WAL needs shared memory on one host.

"WAL does not work over a network filesystem" (sqlite.org/wal.html); an index there
corrupts silently once two hosts open it. Several servers share a cold tier through a
PostgreSQL index instead (docs/multi-machine.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smbfs",
        "smb3",
        "afpfs",
        "webdav",
        "9p",
        "ceph",
        "glusterfs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.cephfs",
        "fuse.weed",
        "fuse.s3fs",
        "lustre",
    }
)

_OCTAL = re.compile(r"\\([0-7]{3})")  # /proc/self/mounts writes a space as \040


class NetworkFilesystemError(ValueError):
    """The SQLite index would sit on a network filesystem."""


def parse_linux_mounts(text: str) -> list[tuple[str, str]]:
    """``(mount point, fs type)`` pairs of ``/proc/self/mounts`` (octal escapes undone)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[1])
            mounts.append((point, fields[2]))
    return mounts


def parse_bsd_mount_output(text: str) -> list[tuple[str, str]]:
    """``(mount point, fs type)`` pairs of macOS/BSD ``mount``: ``dev on /point (type, opts)``."""
    mounts = []
    for line in text.splitlines():
        head, sep, rest = line.rpartition(" (")
        if not sep or " on " not in head:
            continue
        point = head.split(" on ", 1)[1]
        mounts.append((point, rest.split(",", 1)[0].rstrip(")").strip()))
    return mounts


def filesystem_type(path: str | os.PathLike[str]) -> str | None:
    """The type of the filesystem holding ``path`` (its nearest existing folder), if known."""
    target = Path(path).expanduser().absolute()
    while not target.exists() and target != target.parent:
        target = target.parent
    target = target.resolve()
    try:
        if sys.platform.startswith("linux"):
            mounts = parse_linux_mounts(Path("/proc/self/mounts").read_text())
        else:
            out = subprocess.run(["mount"], capture_output=True, text=True, timeout=10).stdout
            mounts = parse_bsd_mount_output(out)
    except (OSError, subprocess.SubprocessError):
        return None
    return _longest_match(target, mounts)


def _longest_match(target: Path, mounts: list[tuple[str, str]]) -> str | None:
    best: tuple[int, str] | None = None
    for point, kind in mounts:
        mount = Path(point)
        if (target == mount or mount in target.parents) and (
            best is None or len(mount.parts) >= best[0]
        ):
            best = (len(mount.parts), kind)  # later lines shadow earlier ones at one point
    return best[1] if best else None


def refuse_network_filesystem(db_path: str | os.PathLike[str], kind: str | None = None) -> None:
    """Raise :class:`NetworkFilesystemError` when ``db_path`` is on NFS, SMB and the like."""
    kind = filesystem_type(db_path) if kind is None else kind
    if kind is not None and (kind in NETWORK_FILESYSTEMS or kind.startswith(("nfs", "smb"))):
        raise NetworkFilesystemError(
            f"the SQLite index {db_path} would be on a network filesystem ({kind}): SQLite's "
            "WAL does not work over one. Keep the cache folder on a local disk, or share it "
            "between servers with a PostgreSQL index (--index-url postgresql+psycopg://…; "
            "docs/multi-machine.md)"
        )
