"""Stored responses in memory: the ``ResponseStore`` used when there is no SSD tier (no index
database), bounded by the same retention rule as the SQL one and lost at exit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from omlx.domain.responses import ResponseStore, Retention, StoredResponse

__all__ = ["MemoryResponseStore", "ResponseStore", "Retention", "StoredResponse"]


class MemoryResponseStore:
    """Implements ``ResponseStore``; the oldest records (by ``created_at``) are pruned first."""

    def __init__(self, retention: Retention, clock: Callable[[], float] = time.time) -> None:
        self.retention = retention
        self._clock = clock
        self._items: dict[str, StoredResponse] = {}
        self._lock = threading.Lock()

    def put(self, record: StoredResponse) -> None:
        with self._lock:
            self._items[record.id] = record
            self._prune()

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            record = self._items.get(response_id)
            if record is None or record.created_at < self.retention.cutoff(self._clock()):
                return None
            return record

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def _prune(self) -> None:
        cutoff = self.retention.cutoff(self._clock())
        for key in [k for k, r in self._items.items() if r.created_at < cutoff]:
            del self._items[key]
        excess = self.retention.excess(len(self._items))
        if excess:
            oldest = sorted(self._items.values(), key=lambda r: (r.created_at, r.id))[:excess]
            for r in oldest:
                del self._items[r.id]
