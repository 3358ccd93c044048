"""Counters by name behind one lock, read as one frozen stats value.

The one stats convention of the cache: the prefix cache, the cold tier and the block
writer each count into a ``Tally`` and answer ``stats()`` with a frozen dataclass read
from it. Each counter is spelled once, as a field of that dataclass: the parts of one
component add to one shared tally, and a misspelt name fails at the first ``stats()``
instead of being a field nobody bumps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from omlx.domain.cache.hot_tier import HotTierStats

S = TypeVar("S")


class Tally:
    """Named cumulative counters (and last values) shared by the parts of one cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float | None] = {}

    def add(self, **amounts: float) -> None:
        """Add each amount to its counter (absent counters start at 0)."""
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] = (self._values.get(name) or 0) + amount

    def set(self, **values: float | None) -> None:
        """Overwrite each value (a last-seen time, the last call's duration)."""
        with self._lock:
            self._values.update(values)

    def read(self) -> dict[str, float | None]:
        """A consistent copy of every counter set so far."""
        with self._lock:
            return dict(self._values)

    def read_as(self, stats: Callable[..., S], **now: object) -> S:
        """The counters read into their frozen ``stats`` value, with the values of ``now``
        (gauges its owner reads at the same moment); a misspelt counter raises here."""
        return stats(**self.read(), **now)


class TenantTally:
    """Lookups, prompt tokens and restored tokens per tenant (``""``: the default one)."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def looked_up(self, tenant: str, prompt_tokens: int, cached_tokens: int) -> None:
        with self._lock:
            counts = self._counts.setdefault(tenant, [0, 0, 0])
            counts[0] += 1
            counts[1] += prompt_tokens
            counts[2] += cached_tokens

    def read(self, tenant: str) -> dict[str, int]:
        with self._lock:
            lookups, prompt, cached = self._counts.get(tenant, (0, 0, 0))
        return {"lookups": lookups, "prompt_tokens": prompt, "cached_tokens": cached}

    def tenants(self) -> list[str]:
        """Every tenant that has looked anything up, by name."""
        with self._lock:
            return sorted(self._counts)


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Cumulative counters of one prefix cache, for metrics and ``/health``.

    Every counter is a field here and nowhere else: the parts add to one ``Tally`` by
    these names.
    """

    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: int = 0
    hot_hits: int = 0
    cold_hits: int = 0
    stored_blocks: int = 0
    queued_blocks: int = 0
    # Blocks the writer's full queue could not take at once: deferred, then queued from RAM
    # (``keeper``), or let go past the keeper's limit of deferred keys.
    deferred_blocks: int = 0
    deferred_written: int = 0
    deferred_dropped: int = 0
    active_leases: int = 0
    last_hit_at: float | None = None
    # Time the request path spent cutting and encoding new blocks (engine thread).
    store_calls: int = 0
    store_seconds: float = 0.0
    last_store_seconds: float = 0.0
    # Lookups that used part of a block, and the tokens those parts restored.
    partial_hits: int = 0
    partial_tokens: int = 0
    # Hybrid layouts: KV-matched tokens recomputed for want of a restore point there,
    # and the state and window objects stored and their bytes.
    lost_tokens: int = 0
    stored_objects: int = 0
    object_bytes: int = 0
    # Requests that continued a kept finished cache in place, and the bytes kept now.
    continued_requests: int = 0
    # Restores whose blocks did not fit the model: dropped from RAM and disk, recomputed.
    dropped_restores: int = 0
    kept_bytes: int = 0
    hot: HotTierStats | None = None  # the RAM tier now
    # ``hit_tokens`` by (tier, origin): ("hot" | "ssd", "self" | "peer" | "unknown"), the
    # tier each restored block came from and who computed it (``origins``).
    hit_tokens_by: dict[tuple[str, str], int] = field(default_factory=dict)
