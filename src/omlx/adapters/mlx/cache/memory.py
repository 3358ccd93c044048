"""The KV memory guard's measurements: physical RAM, and what one request's cache costs.

The guard's arithmetic (``KVBudget``: rectangular batches, growth steps) is pure and
lives in ``omlx.domain.memory``; its decisions in ``omlx.domain.scheduler``. The limit
covers the running requests' KV plus the hot tier's blocks (both are KV in RAM): when a
request needs room, the hot tier gives memory back first (LRU, unpinned blocks); what
still does not fit waits in the queue; what cannot fit even alone is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from typing import Any

# The arithmetic is pure and lives in the domain; measuring a model's cost needs MLX.
from omlx.domain.memory import CACHE_STEP, KVBudget, KVCost, format_bytes

__all__ = [
    "CACHE_STEP",
    "KVBudget",
    "KVCost",
    "auto_limit_bytes",
    "format_bytes",
    "keep_freed_buffers",
    "kv_cost_of",
    "return_freed_memory",
    "total_ram_bytes",
]

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


def return_freed_memory() -> None:
    """Give the buffers of an unloaded model back to the system, so RSS really falls.

    MLX keeps freed buffers in a cache of its own (``clear_cache`` empties it), and on
    Linux glibc's malloc keeps freed heap pages: once a large block has been freed, its
    mmap threshold rises and later tensors of that size come from the heap, which
    ``free`` does not shrink. ``malloc_trim(0)`` hands those pages back (measured: an
    unloaded 538 MB model left RSS at 660 MB without it, 140 MB with it).
    """
    import mlx.core as mx

    mx.clear_cache()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # musl and others: no malloc_trim
            ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)


# MLX's buffer pool, as a share of the KV memory guard's limit (``keep_freed_buffers``).
BUFFER_POOL_SHARE = 0.25


def keep_freed_buffers(kv_limit_bytes: int | None) -> int:
    """Let MLX keep freed buffers for reuse, up to a share of the KV limit; its pool size.

    MLX's CPU backend keeps 32 MB of freed buffers by default, so each turn's KV arrays
    (a restored cache, the growth steps) are fresh memory, every page of it a fault:
    on the bench VM an 8B model's 4k-token follow-up took 150-360k faults and 1.0-1.8 s;
    kept, 0-2k faults and 0.6 s. The pool refills only between turns (mlx-lm clears it
    during prefill) and the engine empties it when idle (``release_buffers_after_s``).
    Never lowers a larger default (Metal's is its memory limit).
    """
    import mlx.core as mx

    want = int((kv_limit_bytes or auto_limit_bytes() or 0) * BUFFER_POOL_SHARE)
    previous = mx.set_cache_limit(want)
    if previous > want:
        mx.set_cache_limit(previous)
        return previous
    return want


def auto_limit_bytes(fraction: float = AUTO_LIMIT_FRACTION) -> int | None:
    """The default limit: ``fraction`` of physical RAM; None (no guard) when RAM is unknown."""
    ram = total_ram_bytes()
    return None if ram is None else int(ram * fraction)


def kv_cost_of(leaves: list[Any]) -> KVCost:
    """A request's cache cost, read off the leaf caches of a one-token cache (exact for any
    architecture): bytes per position of the full and the sliding-window layers, the
    longest window, and the fixed bytes of state layers.

    The probe at load (``layout.probe_model``) makes that cache; this runs no pass.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, RotatingKVCache

    kv = window = size = fixed = 0
    for layer in leaves:
        if isinstance(layer, ArraysCache):
            fixed += sum(a.nbytes for a in layer.cache if a is not None)
            continue
        arrays = (getattr(layer, "keys", None), getattr(layer, "values", None))
        cost = sum(
            a.nbytes // a.shape[2]
            for a in arrays
            if isinstance(a, mx.array) and a.ndim == 4 and a.shape[2]
        )
        if isinstance(layer, RotatingKVCache):
            window += cost
            size = max(size, layer.max_size)
        else:
            kv += cost
    return KVCost(kv, window, size, fixed)
