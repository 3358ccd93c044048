"""The cache folder is private to the server's user: folders 0700, files 0600 (DESIGN, Trust).

Prompts can be read back from block files and the index, so nobody else on the machine
may list or open them. Modes are set explicitly rather than left to the umask: a folder
made by ``mkdir`` gets ``0777 & ~umask`` (usually 0755), so it is chmodded after; a file
is created with 0600, which a umask can only narrow.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private_dir(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents, each 0700; the folders created, outermost first."""
    missing = [p for p in (*reversed(folder.parents), folder) if not p.exists()]
    for path in missing:
        try:
            path.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:  # another thread or server made it just now
            continue
        os.chmod(path, PRIVATE_DIR)
    return missing


def make_private(folder: Path) -> None:
    """``folder`` created if missing, and 0700 whether new or not (an older server made it 0755)."""
    make_private_dir(folder)
    if folder.stat().st_mode & 0o777 != PRIVATE_DIR:
        os.chmod(folder, PRIVATE_DIR)


def touch_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (SQLite gives its -wal and
    -shm files the mode of the database file, so creating that first is enough)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
