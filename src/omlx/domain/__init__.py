"""The pure-Python core of omlx: the block cache (``cache/``), ports, generation vocabulary.

Imports only the standard library (``tests/unit/test_domain_imports.py`` checks it).
"""

from __future__ import annotations

from omlx.domain.cache.blocks import (
    BlockMeta,
    DecodedBlock,
    NamespaceInfo,
    NamespaceUsage,
    PrefixHit,
    StoredBlock,
)
from omlx.domain.cache.cold_writes import ColdWrites, WriteOutcome
from omlx.domain.cache.eviction import LRUPolicy, plan_eviction
from omlx.domain.cache.hot_tier import HotBlock, HotTier, HotTierStats
from omlx.domain.cache.keys import CACHE_FORMAT_VERSION, block_key, chain_keys, namespace_digest
from omlx.domain.cache.partial_match import PartialMatch, best_child, common_prefix
from omlx.domain.cache.ports import (
    BlockIndex,
    BlockStore,
    ByteBudget,
    ColdSource,
    EvictionPolicy,
    KeptCaches,
    KVCodec,
)
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.cache.probation import ProbationPolicy
from omlx.domain.cache.reuse_eviction import ReuseLevelPolicy
from omlx.domain.cache.session import CacheSession
from omlx.domain.cache.tally import PrefixCacheStats
from omlx.domain.ports import Clock, SystemClock

__all__ = [
    "CACHE_FORMAT_VERSION",
    "BlockIndex",
    "BlockMeta",
    "BlockStore",
    "ByteBudget",
    "CacheSession",
    "Clock",
    "ColdSource",
    "ColdWrites",
    "DecodedBlock",
    "EvictionPolicy",
    "HotBlock",
    "HotTier",
    "HotTierStats",
    "KVCodec",
    "KeptCaches",
    "LRUPolicy",
    "NamespaceInfo",
    "NamespaceUsage",
    "PartialMatch",
    "PrefixCache",
    "PrefixCacheStats",
    "PrefixHit",
    "ProbationPolicy",
    "ReuseLevelPolicy",
    "StoredBlock",
    "SystemClock",
    "WriteOutcome",
    "best_child",
    "block_key",
    "chain_keys",
    "common_prefix",
    "namespace_digest",
    "plan_eviction",
]
