"""``ColdWrites``: the cold tier's write policy, run by the block writer's thread per block.

Before the file: skip a key that has a row, record the namespace, and make room within
the byte budget (LRU victims first, pinned blocks never; with a shared index, blocks any
server used within ``lease`` seconds never either, and another server's eviction is
waited for briefly, else the write is dropped). After the file: add the row, the first
writer winning (a loser deletes its own file unless the winner's row names that very
file); a namespace an admin dropped is recorded again; with a shared index the total is
read again, and a write that overshot the budget is undone. A row never exists without
its file, and a file whose row failed does not stay (DESIGN §4, docs/multi-machine.md).

The writer keeps the I/O: the queue, the file's bytes and checksum, and what a failure
of the disk means. Standard library only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo, StoredBlock
from omlx.domain.cache.eviction import evict
from omlx.domain.cache.ports import BlockIndex, BlockStore, ByteBudget, IndexUnavailable
from omlx.domain.cache.tally import Tally
from omlx.domain.ports import Clock, SystemClock

log = logging.getLogger(__name__)

USED_REFRESH_S = 30.0  # re-read the index's byte total this often (others may remove rows)
EVICTION_WAIT_S = 2.0  # how long to wait for another server's eviction before dropping


class WriteOutcome(StrEnum):
    """How the policy ended a block's write; each value is its counter in ``WriterStats``."""

    WRITTEN = "written"
    EXISTING = "skipped_existing"  # its key has a row already
    LOST_RACE = "lost_races"  # another server recorded the key first (a shared index)
    NO_ROOM = "dropped_no_space"  # not within the budget, even after eviction


@dataclass(frozen=True, slots=True)
class WriterStats:
    """Cumulative counters of the cold tier's writes (the queue's and the policy's), for
    metrics and the library's ``stats()``; ``queued`` is the queue's length now."""

    written: int = 0
    written_bytes: int = 0
    write_seconds: float = 0.0
    skipped_existing: int = 0
    lost_races: int = 0
    dropped_queue_full: int = 0
    dropped_no_space: int = 0
    dropped_read_only: int = 0
    dropped_io_error: int = 0
    dropped_damaged: int = 0
    dropped_unreachable: int = 0  # an object store down or throttling, after its retries
    dropped_denied: int = 0  # an object store refusing our credentials
    retried: int = 0  # writes put back for another try after a transient fault
    dropped_closed: int = 0
    dropped_error: int = 0
    dropped_index_unavailable: int = 0
    evicted_blocks: int = 0
    evicted_bytes: int = 0
    queued: int = 0
    awaiting_retry: int = 0


class ColdWrites:
    """The write policy over the block store and the index; one caller thread at a time.

    ``disk_fault`` tells a failure of the disk (full, read-only, I/O) from any other
    failed insert, which may mean an admin dropped the namespace's row: only the latter
    is retried after recording the namespace again.
    """

    def __init__(
        self,
        store: BlockStore,
        index: BlockIndex,
        budget: ByteBudget,
        *,
        is_pinned: Callable[[str], bool] = lambda key: False,
        clock: Clock | None = None,
        shared: bool = False,
        lease: float = 0.0,
        tally: Tally | None = None,
        disk_fault: Callable[[BaseException], bool] = lambda exc: False,
        eviction_wait: float = EVICTION_WAIT_S,
    ) -> None:
        self._store, self._index, self._budget = store, index, budget
        self._is_pinned = is_pinned
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._shared, self._lease = shared, lease
        self._tally = tally if tally is not None else Tally()
        self._disk_fault = disk_fault
        self._eviction_wait = eviction_wait
        self._namespaces: set[str] = set()  # recorded by this writer (an admin may drop them)
        self._orphans: set[str] = set()  # files whose row failed and that could not be removed
        self._used: int | None = None  # bytes of blocks indexed, as last read or counted
        self._used_at = 0.0

    def admit(self, meta: BlockMeta, namespace: NamespaceInfo, nbytes: int) -> WriteOutcome | None:
        """None: write the block's ``nbytes`` file now, room is made; else why not."""
        if meta.key in self._index.get_blocks([meta.key]):
            return WriteOutcome.EXISTING
        if namespace.digest not in self._namespaces:
            self._index.upsert_namespace(namespace)
            self._namespaces.add(namespace.digest)
        if not self._make_room(nbytes):
            log.debug("no room within the cache budget for block %s; not written", meta.key)
            return WriteOutcome.NO_ROOM
        return None

    def record(
        self, namespace: NamespaceInfo, meta: BlockMeta, relpath: str, checksum: str, nbytes: int
    ) -> WriteOutcome:
        """Add the row of the file just written durably at ``relpath``, or undo the file.

        Raises what the index raised, after removing the file: no row, no file.
        """
        now = self._clock.now()
        block = StoredBlock(
            key=meta.key,
            namespace=meta.namespace,
            parent_key=meta.parent_key,
            token_count=meta.token_count,
            nbytes=nbytes,
            checksum=checksum,
            relpath=relpath,
            created_at=now,
            last_access=now,
            kind=meta.kind,
            computed_by=meta.computed_by or None,
        )
        try:
            recorded = self._add_row(namespace, block, meta)
        except Exception:
            self._delete_orphan(relpath)
            raise
        if not recorded:
            self._lose_race(block)
            return WriteOutcome.LOST_RACE
        if self._shared and not self._still_within_budget(block):
            return WriteOutcome.NO_ROOM
        self._used = (self._used or 0) + nbytes
        if self._orphans:
            self._retry_orphans()
        return WriteOutcome.WRITTEN

    def forget_usage(self) -> None:
        """Read the byte total (and the budget's free space) again before the next admission:
        a write failed, so what the disk holds is not what was counted."""
        self._used = None

    def _add_row(self, namespace: NamespaceInfo, block: StoredBlock, meta: BlockMeta) -> bool:
        try:
            return self._index.add_block(block, meta.tokens, meta.image)
        except IndexUnavailable:
            raise
        except Exception as exc:
            if self._disk_fault(exc):
                raise
            # An admin may have dropped the namespace row (cache clear): restore it once.
            log.info("re-recording namespace %s after a failed insert", namespace.digest[:12])
            self._index.upsert_namespace(namespace)
            return self._index.add_block(block, meta.tokens, meta.image)

    def _lose_race(self, block: StoredBlock) -> None:
        """Another writer recorded this key first: keep only the file its row names."""
        winner = self._index.get_blocks([block.key]).get(block.key)
        if winner is None or winner.relpath != block.relpath:
            self._store.delete(block.relpath)
        log.debug("block %s was recorded by another server first", block.key)

    def _delete_orphan(self, relpath: str) -> None:
        """Remove a file whose row was not written; when the folder refuses even that (it
        became read-only), remember it and retry after the next successful write."""
        try:
            self._store.delete(relpath)
        except OSError:
            self._orphans.add(relpath)

    def _retry_orphans(self) -> None:
        for relpath in list(self._orphans):
            try:
                self._store.delete(relpath)
            except OSError:
                return
            self._orphans.discard(relpath)

    def _still_within_budget(self, block: StoredBlock) -> bool:
        """After our insert: if servers writing at once overshot the shared budget, evict or undo ours."""
        used = self._index.total_bytes()
        limit = self._budget.limit(used)
        if used > limit:
            self._evict(limit)
            used = self._index.total_bytes()
        self._used, self._used_at = used, time.monotonic()
        if used <= limit:
            return True
        log.warning(
            "the shared cache budget is full of recently used blocks; block %s undone", block.key
        )
        self._index.remove_blocks([block.key])  # row first, file second
        self._store.delete(block.relpath)
        self._used = None
        return False

    def _make_room(self, incoming: int) -> bool:
        """Evict LRU blocks so ``incoming`` more bytes fit the budget; False if they cannot."""
        now = time.monotonic()
        if self._shared or self._used is None or now - self._used_at > USED_REFRESH_S:
            self._used, self._used_at = self._index.total_bytes(), now
        limit = self._budget.limit(self._used)
        if self._used + incoming <= limit:
            return True
        if incoming > limit:
            return False  # evicting frees disk as it shrinks usage: the limit stays; never fits
        self._evict(limit - incoming)
        self._used, self._used_at = self._index.total_bytes(), time.monotonic()
        return self._used + incoming <= limit

    def _evict(self, max_bytes: int) -> None:
        """Evict down to ``max_bytes``, waiting a little while another server evicts."""
        deadline = time.monotonic() + self._eviction_wait
        while True:
            accessed_before = self._clock.now() - self._lease if self._shared else None
            victims = evict(
                self._index,
                self._store,
                max_bytes,
                self._is_pinned,
                accessed_before=accessed_before,
            )
            if victims is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if victims:
            self._tally.add(
                evicted_blocks=len(victims), evicted_bytes=sum(v.nbytes for v in victims)
            )
