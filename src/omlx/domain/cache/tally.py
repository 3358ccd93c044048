"""Counters by name behind one lock, read as one frozen stats value.

Each counter is spelled once, as a field of the stats dataclass it is read into: the
parts of the prefix cache add to one shared tally, and a misspelt name fails at the
first ``stats()`` instead of being a field nobody bumps.
"""

from __future__ import annotations

import threading


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
