"""Keeping rows and files in step: verify every block, reconcile the store with the index.

Used by ``omlx admin cache verify|vacuum`` and by a server's start-up reconcile, over
any store that can list its blocks (``ListableStore``: a cache folder, a bucket). Safe
beside live servers given a ``grace`` period: a block file (or object) younger than that
may be one a writer has just put in place and is about to index, and a row younger than
that may name a file a network share does not show this host yet, so both are left
alone. With a shared index, callers run it under ``SqlBlockIndex.maintenance_lock()``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from omlx.adapters.blockfiles.expected import BlockSpec, file_problem, spec_of
from omlx.adapters.blockfiles.format import unpack_block
from omlx.adapters.blockfiles.image_files import check_image_block
from omlx.adapters.blockfiles.store import key_of
from omlx.domain.cache.blocks import StoredBlock
from omlx.domain.cache.keys import EXTERNAL, IMAGE, rederives
from omlx.domain.cache.ports import BlockIndex, BlockStore, ByteBudget

if TYPE_CHECKING:
    from omlx.adapters.sqlindex.repository import NamespaceRecord

T = TypeVar("T")
# Wraps an iterable to show progress: (items, length or None, label) -> items.
Progress = Callable[[Iterable[T], int | None, str], Iterable[T]]
LIVE_GRACE_S = 60.0  # files younger than this may belong to a live server's writer


def no_progress(items: Iterable[T], length: int | None, label: str) -> Iterable[T]:
    return items


class ScannableIndex(BlockIndex, Protocol):
    """The index port plus a full scan (``SqlBlockIndex`` has it)."""

    def iter_blocks(self) -> Iterator[StoredBlock]: ...

    def block_count(self) -> int: ...

    def old_format_namespaces(self) -> list[str]: ...

    def remove_namespaces(self, digests: Sequence[str]) -> list[StoredBlock]: ...

    def namespace_records(self) -> list[NamespaceRecord]: ...


class ListableStore(BlockStore, Protocol):
    """The store port plus what a sweep needs: one listing with sizes and modification
    times, one block's, and its own tidying (``FileBlockStore``, ``S3BlockStore``)."""

    label: str

    def iter_objects(self) -> Iterator[tuple[str, int, float]]:
        """Every complete block: ``(relpath, size, modified)`` (Unix time)."""
        ...

    def file_info(self, relpath: str) -> tuple[int, float] | None:
        """``(size, modified)`` of one block, or None when there is none."""
        ...

    def remove_temp_files(
        self, older_than: float | None = None, *, own_older_than: float | None = None
    ) -> int: ...

    def prune_empty_dirs(self) -> int: ...

    def budget(self, max_bytes: int) -> ByteBudget:
        """What the store may hold under a ``max_bytes`` setting (a disk keeps a reserve)."""
        ...


@dataclass(slots=True)
class ReconcileReport:
    temp_files: int = 0
    rows_without_files: int = 0
    files_without_rows: int = 0
    orphan_bytes: int = 0

    def __str__(self) -> str:
        """For the log: what was removed, in words."""
        parts = [
            f"{n} {what}"
            for n, what in (
                (self.temp_files, "leftover temporary files"),
                (self.rows_without_files, "rows without files"),
                (self.files_without_rows, "files without rows"),
            )
            if n
        ]
        if not parts:
            return "nothing to remove"
        return "removed " + ", ".join(parts) + f" ({self.orphan_bytes / 1e6:.1f} MB)"


def check_block(
    store: ListableStore, block: StoredBlock, spec: BlockSpec | None = None
) -> str | None:
    """Why ``block`` must not be served, or None when its file is sound.

    ``spec``: its namespace's recorded block spec, when a server recorded one; then the
    file's tensors, token count and ids and values are checked against it as a read is.
    """
    try:
        data = store.read(block.relpath)
    except FileNotFoundError:
        return "file missing"
    if len(data) != block.nbytes:
        return f"size {len(data)} != {block.nbytes} in the index"
    if hashlib.sha256(data).hexdigest() != block.checksum:
        return "checksum mismatch"
    if block.kind == IMAGE:  # a VLM's image rows: no tokens, no KV layers
        return check_image_block(data, block)
    try:
        tokens, _, metadata = unpack_block(data)
    except ValueError as exc:
        return f"malformed: {exc}"
    # What the model computes first (as a read checks it): a token id outside the
    # vocabulary is named, not reported as a key that does not rehash.
    problem = None if spec is None else file_problem(spec, data)
    if problem is not None:
        return problem
    # An external block (the library API's) has no tokens: its key must follow from its
    # caller's hash, and the checksum above was the check of its bytes.
    if not rederives(block.kind, block.key, block.parent_key, tokens, block.namespace):
        if block.kind == EXTERNAL:
            return "the key does not follow from the caller's hash"
        return "tokens do not rehash to the key"
    if metadata["key"] != block.key or metadata["namespace"] != block.namespace:
        return "metadata names another block"
    if block.kind == EXTERNAL and metadata["parent_key"] != block.parent_key:
        return "metadata names another caller's hash"
    if metadata.get("kind", "kv") != block.kind:
        return f"the file holds a {metadata.get('kind')!r} object, the row a {block.kind!r}"
    return None


def verify(
    index: ScannableIndex, store: ListableStore, progress: Progress = no_progress
) -> list[tuple[StoredBlock, str]]:
    """Every indexed block that fails :func:`check_block`, with the reason (against its
    namespace's recorded block spec where a server recorded one)."""
    specs = {r.info.digest: spec_of(r.info.block_spec) for r in index.namespace_records()}
    bad: list[tuple[StoredBlock, str]] = []
    for block in progress(index.iter_blocks(), index.block_count(), "verifying blocks"):
        problem = check_block(store, block, specs.get(block.namespace))
        # A live server may have evicted it (row, then file) since the scan read the row.
        if problem == "file missing" and block.key not in index.get_blocks([block.key]):
            continue
        if problem is not None:
            bad.append((block, problem))
    return bad


def remove_blocks(index: BlockIndex, store: ListableStore, blocks: Sequence[StoredBlock]) -> int:
    """Rows first (one transaction), files after the commit; returns the bytes freed."""
    if not blocks:
        return 0
    index.remove_blocks([b.key for b in blocks])
    return delete_files(store, blocks)


def delete_files(
    store: ListableStore, blocks: Sequence[StoredBlock], progress: Progress = no_progress
) -> int:
    """Delete the files of blocks whose rows are already gone; returns the bytes freed."""
    freed = 0
    for block in progress(blocks, len(blocks), "deleting block files"):
        info = store.file_info(block.relpath)
        store.delete(block.relpath)
        freed += info[0] if info else 0
    return freed


def collect_old_formats(index: ScannableIndex, store: ListableStore) -> int:
    """Remove the blocks of namespaces written in an older block format; returns how many.

    A format change gives every model a new namespace, so those blocks can never be
    served again: they are collected (rows, then files), never read.
    """
    digests = index.old_format_namespaces()
    if not digests:
        return 0
    blocks = index.remove_namespaces(digests)
    delete_files(store, blocks)
    return len(blocks)


def reconcile(
    index: ScannableIndex,
    store: ListableStore,
    *,
    grace: float | None,
    own_grace: float | None = None,
    progress: Progress = no_progress,
) -> ReconcileReport:
    """Remove leftover temp files, rows without files and files without rows.

    ``grace=None``: the caller owns the folder (holds its lock), everything stale goes.
    Otherwise files modified, and rows created, within ``grace`` seconds are kept.
    ``own_grace`` applies to the store's own temporary files instead (a restarted
    server's leftovers: no live process writes under its identity but itself).
    """
    report = ReconcileReport(
        temp_files=store.remove_temp_files(older_than=grace, own_older_than=own_grace)
    )
    now = time.time()
    # One listing, taken before the rows are read: a row written since has a young
    # created_at (spared by the grace), and a bucket lists faster than it answers a HEAD
    # per row.
    listed = {
        rel: (size, modified)
        for rel, size, modified in progress(store.iter_objects(), None, "checking block files")
    }
    unlisted = [
        b
        for b in progress(index.iter_blocks(), index.block_count(), "checking index rows")
        if (grace is None or now - b.created_at > grace) and b.relpath not in listed
    ]
    # Asked again one by one before the rows go (few): a listing may lag a write.
    missing = [b for b in unlisted if store.file_info(b.relpath) is None]
    if missing:
        index.remove_blocks([b.key for b in missing])
    report.rows_without_files = len(missing)
    indexed = index.all_relpaths()
    candidates: list[tuple[str, int]] = []
    for rel, (size, modified) in listed.items():
        if rel in indexed or (grace is not None and now - modified <= grace):
            continue
        candidates.append((rel, size))
    # Re-read the rows right before deleting: a block written since the snapshot is kept.
    keys = [key_of(rel) for rel, _ in candidates]
    rows = index.get_blocks(keys)
    for (rel, size), key in zip(candidates, keys, strict=True):
        row = rows.get(key)
        if row is not None and row.relpath == rel:
            continue
        store.delete(rel)
        report.files_without_rows += 1
        report.orphan_bytes += size
    if grace is None:
        store.prune_empty_dirs()  # with a live server, a new folder may be about to get a file
    return report
