"""Exact KV mode's fresh caches: full-attention layers hold codes, as they will be stored.

What a model's cache is in exact mode (``kv_mode``), and whether the model allows it:
mlx-lm's cache with each full-attention ``KVCache`` made an ``ExactKVCache`` (the batcher
merges those into a ``BatchQuantizedKVCache``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import CacheList, KVCache, make_prompt_cache

from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import ExactKVCache


def exact_prompt_cache(model: Any, group_size: int, bits: int) -> list[Any]:
    """A fresh cache for ``model`` whose full-attention layers hold codes (exact mode).

    Sliding-window and state layers stay as mlx-lm makes them, in full precision: mlx-lm
    has no quantized rotating batch cache, and SSM state is not KV.
    """

    def convert(entry: Any) -> Any:
        if isinstance(entry, CacheList):
            return CacheList(*(convert(c) for c in entry.caches))
        if type(entry) is KVCache:
            return ExactKVCache(group_size=group_size, bits=bits)
        return entry

    return [convert(entry) for entry in make_prompt_cache(model)]


def exact_fits(model: Any, group_size: int) -> bool:
    """Whether every full-attention layer's head_dim is a multiple of ``group_size`` (one
    token through a fresh cache shows the shapes)."""
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    dims = []

    def visit(entry: Any) -> None:
        if isinstance(entry, CacheList):
            for c in entry.caches:
                visit(c)
        elif type(entry) is KVCache and entry.keys is not None:
            dims.extend((entry.keys.shape[-1], entry.values.shape[-1]))

    for entry in cache:
        visit(entry)
    return bool(dims) and all(d % group_size == 0 for d in dims)
