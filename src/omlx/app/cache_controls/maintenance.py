"""The SSD tier's upkeep: clear a model's blocks, vacuum, and what the disk holds.

``clear_blocks`` and ``vacuum_blocks`` are the code of ``omlx admin cache clear`` and
``vacuum`` and of the dashboard's actions alike, so the page and the shell cannot drift
apart. ``CacheMaintenance`` runs them on a live server's folder, and then drops from each
loaded model's memory what the disk no longer holds (a cleared model's RAM blocks, the keys
a prefix cache believed were on disk, or they would not be written again). Blocks already
queued for disk when a clear runs are still written; a vacuum never takes a block a
running request holds. Every call blocks (index queries, file deletes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omlx.app.cache_controls.service import CacheControls
from omlx.domain.cache.eviction import evict
from omlx.domain.json_values import JsonObject
from omlx.domain.sizes import format_bytes

if TYPE_CHECKING:  # the folder's adapters are the root's; these functions are handed them
    from omlx.adapters.blockfiles.maintenance import ListableStore
    from omlx.adapters.cold_folder import ColdFolder
    from omlx.adapters.sqlindex import SqlBlockIndex

log = logging.getLogger(__name__)

Progress = Callable[[Iterable[Any], int | None, str], Iterable[Any]]


@dataclass(frozen=True, slots=True)
class Cleared:
    blocks: int
    namespaces: int
    nbytes: int


def count(n: int, noun: str) -> str:
    """``1 namespace``, ``2 namespaces``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def clear_blocks(
    index: SqlBlockIndex,
    store: ListableStore,
    model: str | None,
    progress: Progress | None = None,
) -> Cleared:
    """Delete every cached block, or ``model``'s (rows first, files second).

    LookupError names the cached models when none is called ``model``.
    """
    records = index.namespace_records()
    chosen = [r for r in records if model is None or r.info.model_name == model]
    if model is not None and not chosen:
        known = ", ".join(sorted({r.info.model_name for r in records})) or "none"
        raise LookupError(f"no cached model named {model!r} (cached: {known})")
    from omlx.adapters.blockfiles.maintenance import delete_files, no_progress

    blocks = index.remove_namespaces([r.info.digest for r in chosen])
    freed = delete_files(store, blocks, progress or no_progress)
    return Cleared(len(blocks), len(chosen), freed)


def vacuum_blocks(
    index: SqlBlockIndex,
    store: ListableStore,
    *,
    grace: float | None,
    max_bytes: int | None,
    unused_namespaces: bool = False,
    unused_days: float = 30.0,
    lease: float | None = None,
    is_pinned: Callable[[str], bool] = lambda key: False,
    say: Callable[[str], None] = log.info,
    progress: Progress | None = None,
) -> int | None:
    """Reconcile, drop unused namespaces if asked, evict LRU blocks past ``max_bytes``.

    The bytes of block files freed; None when another server or admin holds the
    maintenance lock.
    """
    from omlx.adapters.blockfiles.maintenance import delete_files, no_progress, reconcile

    progress = progress or no_progress
    with index.maintenance_lock() as ours:
        if not ours:
            return None
        report = reconcile(index, store, grace=grace, progress=progress)
        say(f"removed {report.temp_files} leftover temporary files")
        say(f"removed {report.rows_without_files} rows without files")
        say(
            f"removed {report.files_without_rows} files without rows "
            f"({format_bytes(report.orphan_bytes)})"
        )
        freed = report.orphan_bytes
        if unused_namespaces:
            stale = unused_namespaces_of(index, unused_days)
            blocks = index.remove_namespaces([ns for ns, _ in stale])
            for digest, name in stale:
                say(f"dropped unused model {name} [{digest[:12]}]")
            gone = delete_files(store, blocks, progress)
            say(
                f"dropped {count(len(stale), 'unused namespace')}: "
                f"{count(len(blocks), 'block')} ({format_bytes(gone)})"
            )
            freed += gone
        budget = store.budget(max_bytes if max_bytes is not None else 2**62)
        used = index.total_bytes()
        accessed_before = None if lease is None else time.time() - lease
        victims = evict(
            index, store, budget.limit(used), is_pinned, accessed_before=accessed_before
        )
        if victims is None:
            say("another server is evicting now; the budget is left to it")
            victims = []
        evicted = sum(v.nbytes for v in victims)
        spared = "" if lease is None else f"; blocks used in the last {lease:.0f} s were spared"
        say(f"evicted {len(victims)} least recently used blocks ({format_bytes(evicted)}){spared}")
        return freed + evicted


def unused_namespaces_of(index: SqlBlockIndex, days: float) -> list[tuple[str, str]]:
    """Namespaces whose model folder or file is gone, or unused (no use, no hit) for ``days``."""
    newest = {u.namespace: u.newest_access or 0.0 for u in index.usage()}
    cutoff = time.time() - days * 86400
    stale = []
    for rec in index.namespace_records():
        path = Path(rec.info.model_path)
        gone = path.is_absolute() and not path.exists()
        last_use = max(rec.last_used_at, newest.get(rec.info.digest, 0.0))
        if gone or last_use < cutoff:
            stale.append((rec.info.digest, rec.info.model_name))
    return stale


@dataclass(frozen=True, slots=True)
class Vacuumed:
    max_bytes: int
    freed_bytes: int
    report: list[str]


class CacheMaintenance:
    """A live server's SSD tier: clearing, vacuuming and reading its usage.

    ``loaded``: the loaded models' cache controls by model id, asked at each call (models
    come and go). ``queued``: blocks waiting for the writer (usage shows them).
    """

    def __init__(
        self,
        folder: ColdFolder,
        *,
        max_bytes: int,
        lease: float,
        is_pinned: Callable[[str], bool],
        loaded: Callable[[], dict[str, CacheControls]],
        queued: Callable[[], int] = lambda: 0,
    ) -> None:
        self._folder = folder
        self._max_bytes = max_bytes
        self._lease = lease
        self._is_pinned = is_pinned
        self._loaded = loaded
        self._queued = queued

    @property
    def dir(self) -> Path:
        return self._folder.dir

    def clear(self, model_id: str) -> Cleared:
        """Drop ``model_id``'s blocks from disk; a loaded model forgets they were stored.

        LookupError when the disk holds no namespace of that name.
        """
        cleared = clear_blocks(self._folder.index, self._folder.store, model_id)
        controls = self._loaded().get(model_id)
        if controls is not None:
            controls.forget_stored()
        return cleared

    def vacuum(self, max_bytes: int) -> Vacuumed | None:
        """Reconcile and evict LRU blocks past ``max_bytes``; None when another holds the lock."""
        from omlx.adapters.blockfiles.maintenance import LIVE_GRACE_S

        lines: list[str] = []
        freed = vacuum_blocks(
            self._folder.index,
            self._folder.store,
            grace=LIVE_GRACE_S,  # our own writer's files in flight are younger than this
            max_bytes=max_bytes,
            lease=self._lease if self._folder.shared else None,
            is_pinned=self._is_pinned,
            say=lines.append,
        )
        if freed is None:
            return None
        for controls in self._loaded().values():
            controls.forget_stored()
        return Vacuumed(max_bytes, freed, lines)

    def usage(self) -> JsonObject:
        """Blocks, tokens and bytes per namespace, the budget and the write queue (JSON values)."""
        index = self._folder.index
        usage = {u.namespace: u for u in index.usage()}
        namespaces = []
        for rec in index.namespace_records():
            u = usage.get(rec.info.digest)
            tokens, nbytes = (u.tokens, u.nbytes) if u else (0, 0)
            namespaces.append(
                {
                    "model": rec.info.model_name,
                    "namespace": rec.info.digest,
                    "block_size": rec.info.block_size,
                    "blocks": u.blocks if u else 0,
                    "tokens": tokens,
                    "bytes": nbytes,
                    "bytes_per_token": round(nbytes / tokens, 1) if tokens else None,
                    # of those blocks, a VLM's image rows (its encoder's output per image)
                    "image_objects": u.image_objects if u else 0,
                    "image_bytes": u.image_bytes if u else 0,
                }
            )
        used = sum(ns["bytes"] for ns in namespaces)
        return {
            "enabled": True,
            "dir": str(self._folder.dir),
            "store": self._folder.store_url,
            "shared": self._folder.shared,
            "blocks": sum(ns["blocks"] for ns in namespaces),
            "tokens": sum(ns["tokens"] for ns in namespaces),
            "bytes": used,
            "max_bytes": self._folder.store.budget(self._max_bytes).limit(used),
            "configured_max_bytes": self._max_bytes,
            "write_queue": self._queued(),
            "namespaces": namespaces,
        }
