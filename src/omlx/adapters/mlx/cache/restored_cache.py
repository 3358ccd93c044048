"""A restored layer cache that joins a batch without being copied again.

mlx-lm inserts a request's cache into the batcher through ``BatchKVCache.merge``, which
copies every row into a fresh padded array, and the first chunk prefilled after it makes
the batch cache grow: a second copy of the whole cache. For an 8B model's 4k-token
restore that is 2 x 805 MB of copying into fresh memory (~2-5 s on the 2-core bench VM,
where each fresh page costs a fault), on every turn that restores a conversation.

``RestoredKVCache`` is built by the codec's ``assemble`` with room past its offset for
the tokens the request will prefill, and its ``merge`` of a lone row hands the arrays to
the batch cache as they are (``mlx_lm_private.rows.lone_row_batch``): the tail is then
written in place. Several rows merge as mlx-lm merges them, and so does a lone row where
omlx may not use mlx-lm's private state (``mlx_lm_private.version.allowed``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from omlx.adapters.mlx.mlx_lm_private import rows, version


class RestoredKVCache(KVCache):
    """A ``KVCache`` whose arrays may hold room past ``offset``, merged into a batch without a copy."""

    def merge(
        self, caches: list[Any]
    ) -> BatchKVCache:  # mlx-lm calls merge on the first row's cache
        if len(caches) != 1 or caches[0].keys is None or not version.allowed():
            return BatchKVCache.merge(caches)
        row = caches[0]
        batch = rows.lone_row_batch(row)
        # The batch holds the only reference, so MLX can write the prefilled tail into the
        # arrays in place (an array referenced twice is copied whole on a slice update).
        row.keys = row.values = None
        return batch


def with_room(keys: mx.array, values: mx.array, offset: int) -> RestoredKVCache:
    """A restored cache over ``keys``/``values`` whose first ``offset`` positions hold KV."""
    cache = RestoredKVCache()
    cache.keys, cache.values, cache.offset = keys, values, offset
    return cache
