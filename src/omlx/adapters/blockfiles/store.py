"""Block files on disk: layout, durable writes, verified batched reads and cleanup (DESIGN §4).

Layout: ``<cache_dir>/<model-name>-<namespace[:12]>/<key[:2]>/<key>.<sha256[:12]>.safetensors``.
The checksum in the name makes a file content-addressed: servers sharing the folder
that write one key with the same bytes write one file, with different bytes two files,
never one file that matches neither row (docs/multi-machine.md). Older caches named
files ``<key>.safetensors``; their rows keep those paths and reads follow the rows.
Temporary files are ``.<key>.<checksum>.<writer>-<random>.tmp`` in the block's own
folder, so the final ``os.replace`` is atomic, a crashed write leaves only a hidden
``.tmp`` file behind, and a restarted server knows its own leftovers by ``<writer>``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path, PurePosixPath

from omlx.adapters.blockfiles.budget import DiskBudget
from omlx.adapters.blockfiles.reader import READ_THREADS, ReadAhead, verified_read
from omlx.adapters.private_files import PRIVATE_FILE, make_private_dir
from omlx.domain.cache.blocks import BlockRead, NamespaceInfo, StoredBlock

BLOCK_SUFFIX = ".safetensors"
TEMP_SUFFIX = ".tmp"
CHECKSUM_CHARS = 12  # of the hex SHA-256 in a file name: 48 bits tell one key's versions apart
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_HEX = re.compile(r"^[0-9a-f]+$")


def safe_folder_name(model_name: str, max_len: int = 64) -> str:
    """A recognisable, portable folder name for a model: ``org/Model Q8`` -> ``org-Model-Q8``."""
    name = _UNSAFE.sub("-", model_name).strip(".-_")[:max_len].rstrip(".-_")
    return name or "model"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def key_of(relpath: str) -> str:
    """The block key a block file's name starts with (either layout)."""
    return relpath.rsplit("/", 1)[-1].split(".", 1)[0]


def writer_tag(writer_id: str) -> str:
    """``writer_id`` as it appears in temporary file names (no dots or dashes)."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", writer_id)[:48] or "w"


def block_relpath(namespace: NamespaceInfo, key: str, checksum: str) -> str:
    """``<model-name>-<namespace[:12]>/<key[:2]>/<key>.<sha256[:12]>.safetensors``: the name
    of a block's bytes in every store (a folder's file, a bucket's object)."""
    if len(key) < 3 or not key.isalnum():
        raise ValueError(f"bad block key {key!r}")
    if len(checksum) < CHECKSUM_CHARS or not _HEX.match(checksum):
        raise ValueError(f"bad block checksum {checksum!r}")
    folder = f"{safe_folder_name(namespace.model_name)}-{namespace.digest[:12]}"
    return f"{folder}/{key[:2]}/{key}.{checksum[:CHECKSUM_CHARS]}{BLOCK_SUFFIX}"


def is_block_relpath(relpath: str) -> bool:
    """Whether ``relpath`` has the three-level layout of a block's name (either naming)."""
    parts = relpath.split("/")
    return (
        len(parts) == 3
        and all(parts)
        and not any(p.startswith(".") for p in parts)
        and parts[2].endswith(BLOCK_SUFFIX)
    )


class FileBlockStore:
    """``BlockStore`` over one cache folder; relative paths are '/'-separated."""

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        *,
        writer_id: str = "",
        read_threads: int = READ_THREADS,
        durable: bool = True,
    ) -> None:
        """``durable=False``: writes skip the fsyncs (a copy whose loss costs a refetch:
        the read-through tier of an object store; every read checks the checksum)."""
        self.root = Path(cache_dir).expanduser()
        self.label = f"cache folder {self.root}"  # in log lines about its faults
        self.durable = durable
        self.writer_tag = writer_tag(writer_id or f"pid{os.getpid()}")
        self._reader = ReadAhead(self._verified_read, read_threads)
        # Temporary files a failed write could not remove (its folder turned read-only or
        # immutable between creating the file and cleaning up): removed at the next write
        # that succeeds, and at close.
        self._stranded: set[Path] = set()

    def relpath(self, namespace: NamespaceInfo, key: str, checksum: str) -> str:
        return block_relpath(namespace, key, checksum)

    def budget(self, max_bytes: int) -> DiskBudget:
        """``max_bytes``, less what the disk's free-space reserve needs."""
        return DiskBudget(self.root, max_bytes)

    def path(self, relpath: str) -> Path:
        """The absolute path of ``relpath``; refuses anything that escapes the cache folder."""
        rel = PurePosixPath(relpath)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"bad relative path {relpath!r}")
        return self.root.joinpath(*rel.parts)

    def write(self, relpath: str, data: bytes) -> None:
        target = self.path(relpath)
        folder = target.parent
        stem = target.name.removesuffix(BLOCK_SUFFIX)
        tmp = folder / f".{stem}.{self.writer_tag}-{secrets.token_hex(4)}{TEMP_SUFFIX}"
        self._make_dirs(folder)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        except FileNotFoundError:  # an admin pruned the empty folder just now: make it again
            self._make_dirs(folder)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            # ENOSPC and friends: never leave a half-written temp file behind.
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                self._stranded.add(tmp)
            raise
        if self.durable:
            _fsync_dir(folder)
        if self._stranded:
            self._remove_stranded()

    def _remove_stranded(self) -> None:
        for tmp in list(self._stranded):
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                continue
            self._stranded.discard(tmp)

    def read(self, relpath: str) -> bytes:
        return self.path(relpath).read_bytes()

    def read_many(self, blocks: Sequence[StoredBlock]) -> Generator[BlockRead, None, None]:
        return self._reader.read_many(blocks)

    def close(self) -> None:
        self._remove_stranded()
        self._reader.close()

    def _verified_read(self, block: StoredBlock) -> BlockRead:
        # Through self.read, so a subclass (tests: counting, slow stores) sees every read.
        return verified_read(self.read, block)

    def delete(self, relpath: str) -> None:
        self.path(relpath).unlink(missing_ok=True)

    def file_info(self, relpath: str) -> tuple[int, float] | None:
        """``(size, mtime)`` of a block file, or None when it is missing."""
        try:
            st = self.path(relpath).stat()
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime

    def iter_relpaths(self) -> Iterator[str]:
        for rel, _ in self._walk_blocks(temp=False):
            yield rel

    def iter_objects(self) -> Iterator[tuple[str, int, float]]:
        """Every complete block file: ``(relpath, size, mtime)`` (one listing for a sweep)."""
        for rel in self.iter_relpaths():
            info = self.file_info(rel)
            if info is not None:  # removed since the walk
                yield rel, info[0], info[1]

    def iter_temp_files(self) -> Iterator[tuple[str, float]]:
        """Leftover temporary files: ``(relpath, mtime)``."""
        yield from self._walk_blocks(temp=True)

    def remove_temp_files(
        self, older_than: float | None = None, *, own_older_than: float | None = None
    ) -> int:
        """Delete temporary files older than ``older_than`` s (None: all).

        ``own_older_than`` applies instead to this writer's own files (its ``writer_id``):
        a restarted server removes what its previous run left, however young.
        """
        removed = 0
        now = time.time()
        own = f".{self.writer_tag}-"
        for rel, mtime in list(self.iter_temp_files()):
            limit = older_than
            if own_older_than is not None and own in rel.rsplit("/", 1)[-1]:
                limit = own_older_than
            # A live writer's temp file is young: leave it unless the caller says all.
            if limit is not None and now - mtime <= limit:
                continue
            with contextlib.suppress(FileNotFoundError):
                self.path(rel).unlink()
                removed += 1
        return removed

    def prune_empty_dirs(self) -> int:
        """Remove empty model and prefix folders; returns how many went."""
        removed = 0
        for model_dir in self._model_dirs():
            for sub in list(model_dir.iterdir()):
                if sub.is_dir() and _rmdir_if_empty(sub):
                    removed += 1
            if _rmdir_if_empty(model_dir):
                removed += 1
        return removed

    def _model_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]

    def _walk_blocks(self, *, temp: bool) -> Iterator[tuple[str, float]]:
        # Only the three-level layout counts, so index.db, the lock and stray files are ignored.
        for model_dir in self._model_dirs():
            for sub in model_dir.iterdir():
                if not sub.is_dir():
                    continue
                with os.scandir(sub) as entries:
                    for entry in entries:
                        name = entry.name
                        wanted = (
                            is_temp_name(name)
                            if temp
                            else (name.endswith(BLOCK_SUFFIX) and not name.startswith("."))
                        )
                        if wanted and entry.is_file(follow_symlinks=False):
                            mtime = entry.stat().st_mtime if temp else 0.0
                            yield f"{model_dir.name}/{sub.name}/{name}", mtime

    def _make_dirs(self, folder: Path) -> None:
        if folder.is_dir():
            return
        created_folders = make_private_dir(folder)
        # A new folder's entry lives in its parent: fsync those so the layout survives a crash.
        for created in created_folders if self.durable else ():
            _fsync_dir(created.parent)


def _rmdir_if_empty(path: Path) -> bool:
    try:
        path.rmdir()
    except OSError:
        return False
    return True


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
