"""The cache stack as a Python library, for custom inference loops (docs/library.md).

A thin front over the server's own tiers: blocks saved here are kept in RAM and in
the server's cache folder and index, under their model's name, within one budget.
"""

from __future__ import annotations

from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.cache.factory import CacheConfig, CacheFactory
from omlx.cache.paged_cache import PagedCache
from omlx.cache.paged_ssd_cache import BlockMetadata, PagedSSDCacheIndex, PagedSSDCacheManager
from omlx.cache.prefix_cache import BlockAwarePrefixCache
from omlx.domain.cache.kv_quant import KVQuant


def kv_codec(kv_bits: int | str | None = None, kv_group_size: int = 64) -> MLXKVCodec:
    """The server's own block codec for plain mlx-lm caches, quantizing as ``--kv-bits`` does.

    ``split(cache, start, stop)`` cuts a block, ``encode`` / ``decode`` turn it into and out
    of the server's block-file bytes, ``assemble`` joins blocks back into ``KVCache``s
    (dequantized when ``kv_bits`` is 8 or 4; ``None`` / ``"off"``: the cache's own dtype).
    """
    from omlx.domain.cache.kv_quant import kv_quant_of

    return MLXKVCodec(kv_quant=kv_quant_of(kv_bits, kv_group_size))


__all__ = [
    "BlockAwarePrefixCache",
    "BlockMetadata",
    "CacheConfig",
    "CacheFactory",
    "KVQuant",
    "MLXKVCodec",
    "PagedCache",
    "PagedSSDCacheIndex",
    "PagedSSDCacheManager",
    "kv_codec",
]
