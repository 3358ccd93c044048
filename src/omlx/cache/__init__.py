"""The cache stack as a Python library, for custom inference loops (docs/library.md).

A thin front over the server's own tiers: blocks saved here are kept in RAM and in
the server's cache folder and index, under their model's name, within one budget.
"""

from __future__ import annotations

from omlx.cache.factory import CacheConfig, CacheFactory
from omlx.cache.paged_cache import PagedCache
from omlx.cache.paged_ssd_cache import BlockMetadata, PagedSSDCacheIndex, PagedSSDCacheManager
from omlx.cache.prefix_cache import BlockAwarePrefixCache

__all__ = [
    "BlockAwarePrefixCache",
    "BlockMetadata",
    "CacheConfig",
    "CacheFactory",
    "PagedCache",
    "PagedSSDCacheIndex",
    "PagedSSDCacheManager",
]
