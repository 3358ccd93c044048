"""The KV memory guard: what a request's cache will cost, and whether it fits now.

mlx-lm's batch caches are rectangular: every row of a ``BatchKVCache`` is as long
as the longest row (shorter ones are left-padded), and the buffer grows in steps
of 256 positions. So a batch of ``n`` requests whose longest one may reach ``L``
positions (prompt + max_tokens) holds up to ``n * ceil256(L)`` positions of KV,
whatever the others' lengths. The guard reserves that upper bound.

The limit covers the running requests' KV plus the hot tier's blocks (both are KV
in RAM): when a request needs room, the hot tier gives memory back first (LRU,
unpinned blocks); what still does not fit waits in the queue; what cannot fit
even alone is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

# BatchKVCache.step in mlx_lm.models.cache: rows grow in chunks of this many positions.
CACHE_STEP = 256
AUTO_LIMIT_FRACTION = 0.5


def total_ram_bytes() -> int | None:
    """Physical memory, via ``os.sysconf`` (Linux and macOS); None when unknown."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    if pages <= 0 or page_size <= 0:
        return None
    return pages * page_size


def auto_limit_bytes(fraction: float = AUTO_LIMIT_FRACTION) -> int | None:
    """The default limit: ``fraction`` of physical RAM; None (no guard) when RAM is unknown."""
    ram = total_ram_bytes()
    return None if ram is None else int(ram * fraction)


@dataclass(frozen=True, slots=True)
class KVCost:
    """What one request's cache costs, by what each layout really holds.

    ``per_token``: bytes per position of the full-attention layers (they keep every
    position); ``window_per_token``: bytes per position of the sliding layers, which keep
    at most ``window`` positions plus a prefill chunk; ``fixed``: the recurrent layers'
    state, the same at any length.
    """

    per_token: int
    window_per_token: int = 0
    window: int = 0
    fixed: int = 0

    def row_bytes(self, positions: int) -> int:
        windowed = min(positions, self.window + CACHE_STEP) if self.window else 0
        return positions * self.per_token + windowed * self.window_per_token + self.fixed


def measure_kv_cost(model) -> KVCost:
    """A request's cache cost, measured on a one-token cache (exact for any architecture).

    Runs MLX: call it before the engine thread starts or on that thread.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, CacheList, RotatingKVCache, make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    mx.eval([getattr(c, "state", []) for c in cache])
    totals = {"kv": 0, "window": 0, "size": 0, "fixed": 0}

    def walk(layer) -> None:
        if isinstance(layer, CacheList):
            for child in layer.caches:
                walk(child)
            return
        if isinstance(layer, ArraysCache):
            totals["fixed"] += sum(a.nbytes for a in layer.cache if a is not None)
            return
        arrays = (getattr(layer, "keys", None), getattr(layer, "values", None))
        cost = sum(
            a.nbytes // a.shape[2] for a in arrays if isinstance(a, mx.array) and a.ndim == 4 and a.shape[2]
        )
        if isinstance(layer, RotatingKVCache):
            totals["window"] += cost
            totals["size"] = max(totals["size"], layer.max_size)
        else:
            totals["kv"] += cost

    for layer in cache:
        walk(layer)
    return KVCost(totals["kv"], totals["window"], totals["size"], totals["fixed"])


def kv_bytes_per_token(model) -> int:
    """Bytes of KV one position costs in the layers that keep every position."""
    return measure_kv_cost(model).per_token


@dataclass(frozen=True, slots=True)
class KVBudget:
    """The guard's arithmetic; pure Python so it is cheap to call every step."""

    limit_bytes: int
    bytes_per_token: int
    cost: KVCost | None = None  # the whole layout's; None: full attention only

    @property
    def _cost(self) -> KVCost:
        return self.cost if self.cost is not None else KVCost(self.bytes_per_token)

    def positions(self, length: int) -> int:
        """Cache positions a row of ``length`` tokens occupies (rounded up to the growth step)."""
        return -(-max(length, 1) // CACHE_STEP) * CACHE_STEP

    def batch_bytes(self, lengths: Iterable[int]) -> int:
        """Upper bound of the KV of requests that may each reach ``lengths`` positions together."""
        lengths = list(lengths)
        if not lengths:
            return 0
        return len(lengths) * self._cost.row_bytes(self.positions(max(lengths)))

    def fits_alone(self, length: int) -> bool:
        return self.batch_bytes([length]) <= self.limit_bytes

    @property
    def token_capacity(self) -> int:
        """The most positions (prompt + max_tokens) one request may reserve on its own."""
        cost = self._cost
        room = self.limit_bytes - cost.fixed - (cost.window + CACHE_STEP) * cost.window_per_token
        if cost.per_token <= 0:
            return 1 << 62 if room >= 0 else 0
        steps = max(room, 0) // (cost.per_token * CACHE_STEP)
        return steps * CACHE_STEP


def format_bytes(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
