"""The cold tier's byte budget: ``max_bytes``, capped so the disk keeps a free-space reserve.

Reserve policy: unless configured, keep ``min(1 GiB, 5% of the disk's size)`` free;
the cache shrinks (LRU first) rather than fill the disk past that point. A store that is
not this machine's disk (an object store) has ``max_bytes`` alone (``SizeBudget``): the
local disk's free space says nothing about a bucket's.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omlx.domain.tier_defaults import COLD_TIER_DEFAULT_BYTES

RESERVE_CAP = 2**30
RESERVE_FRACTION = 0.05


def default_reserve(disk_total: int) -> int:
    """Free space to leave on a disk of ``disk_total`` bytes: 1 GiB or 5%, whichever is smaller."""
    return min(RESERVE_CAP, int(disk_total * RESERVE_FRACTION))


@dataclass(frozen=True)
class DiskBudget:
    """How many bytes of blocks the cache folder may hold right now (the domain's ``ByteBudget``)."""

    path: Path
    max_bytes: int = COLD_TIER_DEFAULT_BYTES
    reserve_bytes: int | None = None  # None: default_reserve(disk size)
    disk_usage: Callable[[str | os.PathLike[str]], Any] = field(default=shutil.disk_usage)

    def limit(self, used: int) -> int:
        """The byte limit for blocks, given ``used`` bytes of blocks already on this disk."""
        usage = self.disk_usage(self.path)
        reserve = default_reserve(usage.total) if self.reserve_bytes is None else self.reserve_bytes
        # Blocks already stored count as reclaimable: evicting them gives their space back.
        return max(0, min(self.max_bytes, used + usage.free - reserve))


@dataclass(frozen=True)
class SizeBudget:
    """``max_bytes`` and nothing else (the domain's ``ByteBudget``), for a remote store."""

    max_bytes: int = COLD_TIER_DEFAULT_BYTES

    def limit(self, used: int) -> int:
        return self.max_bytes
