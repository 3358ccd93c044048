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


def kv_bytes_per_token(model) -> int:
    """Bytes of KV one position costs across all layers, measured on a one-token cache.

    Exact for any architecture mlx-lm runs (grouped-query heads, different key and
    value widths, the cache's dtype): layers x 2 x kv_heads x head_dim x dtype size
    for a plain llama. Layers without a growing KV (SSM state) cost nothing per token.
    Runs MLX: call it before the engine thread starts or on that thread.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    mx.eval([getattr(c, "state", []) for c in cache])
    total = 0
    for layer in cache:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        for arr in (keys, values):
            if isinstance(arr, mx.array) and arr.ndim == 4 and arr.shape[2] > 0:
                total += arr.nbytes // arr.shape[2]
    return total


@dataclass(frozen=True, slots=True)
class KVBudget:
    """The guard's arithmetic; pure Python so it is cheap to call every step."""

    limit_bytes: int
    bytes_per_token: int

    def positions(self, length: int) -> int:
        """Cache positions a row of ``length`` tokens occupies (rounded up to the growth step)."""
        return -(-max(length, 1) // CACHE_STEP) * CACHE_STEP

    def batch_bytes(self, lengths: Iterable[int]) -> int:
        """Upper bound of the KV of requests that may each reach ``lengths`` positions together."""
        lengths = list(lengths)
        if not lengths:
            return 0
        return len(lengths) * self.positions(max(lengths)) * self.bytes_per_token

    def fits_alone(self, length: int) -> bool:
        return self.batch_bytes([length]) <= self.limit_bytes

    @property
    def token_capacity(self) -> int:
        """The most positions (prompt + max_tokens) one request may reserve on its own."""
        if self.bytes_per_token <= 0:
            return 1 << 62
        steps = self.limit_bytes // (self.bytes_per_token * CACHE_STEP)
        return steps * CACHE_STEP


def format_bytes(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
