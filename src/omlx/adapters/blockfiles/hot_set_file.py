"""A namespace's hot set (warm restart) as a small JSON file beside the block folders.

A file, not a table in the index: the hot set is one server's RAM, not the cache's
contents (servers sharing a PostgreSQL index each hold their own), it is replaced whole
every minute or so (a rename is one atomic step; a table would take a delete and
thousands of inserts in the database the request path reads), and losing it costs only
a colder first turn, never a block. Keys only, no tokens: still private (0600), as the
folder is. ``<cache_dir>/.hot-sets/<namespace>.json``; block walks skip dot folders.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from omlx.adapters.private_files import PRIVATE_FILE, make_private_dir
from omlx.domain.cache.hot_set import HotSet, hot_set_from_json, hot_set_to_json

log = logging.getLogger(__name__)

HOT_SETS_DIR = ".hot-sets"


def hot_set_path(cache_dir: Path, namespace: str, server_id: str = "") -> Path:
    """Where ``namespace``'s hot set is kept; ``server_id`` names it among servers sharing
    the folder (each records what its own RAM held)."""
    name = f"{namespace}.{server_id}.json" if server_id else f"{namespace}.json"
    return cache_dir / HOT_SETS_DIR / name


class HotSetFile:
    """Implements ``HotSetStore`` over one file, written to a temporary file and renamed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> HotSet | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("warm restart: cannot read %s: %s", self.path, exc)
            return None
        try:
            return hot_set_from_json(json.loads(text))
        except ValueError as exc:  # json's errors are ValueErrors too
            log.warning("warm restart: %s is not a hot set (%s); ignored", self.path, exc)
            return None

    def save(self, hot_set: HotSet) -> None:
        folder = self.path.parent
        if not folder.is_dir():
            make_private_dir(folder)
        data = json.dumps(hot_set_to_json(hot_set), separators=(",", ":")).encode()
        tmp = folder / f".{self.path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)  # a crash leaves the old list or the new one
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def saved_hot_sets(cache_dir: Path) -> dict[str, HotSet]:
    """Every hot set saved in ``cache_dir``, by file name (``omlx admin cache stats``)."""
    folder = cache_dir / HOT_SETS_DIR
    if not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.glob("*.json")):
        hot_set = HotSetFile(path).load()
        if hot_set is not None:
            found[path.name] = hot_set
    return found
