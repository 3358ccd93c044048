"""Eviction: the hot tier's LRU policy, the cold tier's pure victim planner and its use case.

All skip pinned blocks: a block in use by a running request is never evicted (DESIGN §4).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable

from omlx.domain.cache.blocks import StoredBlock
from omlx.domain.cache.ports import BlockIndex, BlockStore

log = logging.getLogger(__name__)


class LRUPolicy:
    """Least recently used first; O(1) record and remove (implements ``EvictionPolicy``)."""

    def __init__(self) -> None:
        # Oldest first; values are block sizes in bytes.
        self._order: OrderedDict[str, int] = OrderedDict()

    def record_access(self, key: str, nbytes: int) -> None:
        self._order[key] = nbytes
        self._order.move_to_end(key)

    def record_insert(self, key: str, nbytes: int, parent_key: str | None) -> None:
        self.record_access(key, nbytes)

    def record_hit(self, key: str, nbytes: int) -> None:
        self.record_access(key, nbytes)

    def record_promotion(self, key: str, nbytes: int, parent_key: str | None) -> None:
        self.record_access(key, nbytes)

    def record_prefetch(self, key: str, nbytes: int, parent_key: str | None) -> None:
        # Oldest end: a block read ahead of any request goes before every block one used.
        self._order[key] = nbytes
        self._order.move_to_end(key, last=False)

    def remove(self, key: str) -> None:
        self._order.pop(key, None)

    def choose_victims(self, bytes_to_free: int, is_pinned: Callable[[str], bool]) -> list[str]:
        victims: list[str] = []
        freed = 0
        for key, nbytes in self._order.items():
            if freed >= bytes_to_free:
                break
            if is_pinned(key):
                continue
            victims.append(key)
            freed += nbytes
        return victims

    def promotion_victims(
        self, key: str, bytes_to_free: int, is_pinned: Callable[[str], bool]
    ) -> list[str] | None:
        return self.choose_victims(bytes_to_free, is_pinned)  # every block read back enters

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order


def plan_eviction(
    blocks_oldest_first: Iterable[StoredBlock],
    total_bytes: int,
    max_bytes: int,
    is_pinned: Callable[[str], bool],
) -> list[StoredBlock]:
    """The oldest unpinned blocks whose removal brings ``total_bytes`` down to ``max_bytes``.

    Stops reading ``blocks_oldest_first`` as soon as the budget is met, so callers may
    pass a lazy page of the index; when it runs out first, the plan frees what it can.
    """
    victims: list[StoredBlock] = []
    excess = total_bytes - max_bytes
    for block in blocks_oldest_first:
        if excess <= 0:
            break
        if is_pinned(block.key):
            continue
        victims.append(block)
        excess -= block.nbytes
    return victims


def evict(
    index: BlockIndex,
    store: BlockStore,
    max_bytes: int,
    is_pinned: Callable[[str], bool],
    *,
    accessed_before: float | None = None,
) -> list[StoredBlock] | None:
    """Remove least recently used unpinned blocks until the index holds at most ``max_bytes``.

    The index picks and deletes the rows in one transaction, reading its byte total
    inside it, so servers sharing it never free one block twice; files go after the
    commit (DESIGN §4): a crash in between leaves files without rows, which reconcile
    removes, never rows without files. ``accessed_before`` is the lease: blocks used since
    (by any server) stay. None while another server is evicting.
    """

    def plan(total_bytes: int, oldest_first: Iterable[StoredBlock]) -> list[StoredBlock]:
        return plan_eviction(oldest_first, total_bytes, max_bytes, is_pinned)

    victims = index.evict(plan, accessed_before)
    failed: list[tuple[str, OSError]] = []
    for victim in victims or ():
        try:
            store.delete(victim.relpath)
        except OSError as exc:  # its row is gone: an orphan file, which reconcile removes
            failed.append((victim.relpath, exc))
    if failed:  # one line for the pass: a store that is down fails every delete alike
        log.warning(
            "deleting %d evicted block files failed (%s: %s); reconcile removes them",
            len(failed),
            failed[0][0],
            str(failed[0][1]).splitlines()[0] if str(failed[0][1]) else type(failed[0][1]).__name__,
        )
    return victims
