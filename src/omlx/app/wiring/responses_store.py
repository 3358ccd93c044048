"""Stored responses in memory: the ``ResponseStore`` used when there is no SSD tier (no index
database), bounded by the same retention rule as the SQL one and lost at exit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from omlx.domain.responses import (
    BrokenChain,
    ResponseStore,
    Retention,
    StoredResponse,
    TooLargeToStore,
    folded,
)

__all__ = ["MemoryResponseStore", "ResponseStore", "Retention", "StoredResponse"]


class MemoryResponseStore:
    """Implements ``ResponseStore``; the oldest records (by ``created_at``) are pruned first."""

    def __init__(self, retention: Retention, clock: Callable[[], float] = time.time) -> None:
        self.retention = retention
        self._clock = clock
        self._items: dict[str, StoredResponse] = {}
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, record: StoredResponse) -> None:
        size = record.nbytes
        if not self.retention.fits(size):
            raise TooLargeToStore(
                f"{size} bytes, over responses_max_bytes ({self.retention.max_bytes})"
            )
        with self._lock:
            self._items[record.id] = record
            self._bytes[record.id] = size
            self._prune()

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            record = self._items.get(response_id)
            if record is None or record.created_at < self.retention.cutoff(self._clock()):
                return None
            return record

    def chain(self, response_id: str) -> list[StoredResponse] | None:
        with self._lock:
            record = self._items.get(response_id)
            if record is None or record.created_at < self.retention.cutoff(self._clock()):
                return None
            chain = [record]
            while chain[-1].previous_id is not None:
                earlier = self._items.get(chain[-1].previous_id)
                if earlier is None or len(chain) > len(self._items):
                    raise BrokenChain(
                        f"{chain[-1].previous_id} (continued by {chain[-1].id}) is missing"
                    )
                chain.append(earlier)
            return chain[::-1]

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._remove(response_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    def _remove(self, response_id: str) -> bool:
        removed = self._items.pop(response_id, None)
        if removed is None:
            return False
        del self._bytes[response_id]
        for child in [r for r in self._items.values() if r.previous_id == response_id]:
            kept = folded(removed, child)
            self._items[child.id], self._bytes[child.id] = kept, kept.nbytes
        return True

    def _prune(self) -> None:
        cutoff = self.retention.cutoff(self._clock())
        oldest_first = sorted(self._items.values(), key=lambda r: (r.created_at, r.id))
        for r in oldest_first:
            if r.created_at < cutoff:
                self._remove(r.id)
        for r in sorted(self._items.values(), key=lambda r: (r.created_at, r.id)):
            if not self.retention.excess(len(self._items)) and not self.retention.over_bytes(
                sum(self._bytes.values())
            ):
                break
            self._remove(r.id)
