"""``BlockAwarePrefixCache``: the front a custom inference loop saves and loads its blocks through.

The loop names each block itself (``block_hash``, e.g. a chained SHA-256 of its tokens)
and hands over its KV; this object checks it against the model's layer count and passes
the block to the SSD cache manager, or keeps it in RAM only when there is none.
"""

from __future__ import annotations

from typing import Any

from omlx.cache.paged_cache import PagedCache
from omlx.cache.paged_ssd_cache import BlockMetadata, PagedSSDCacheManager
from omlx.domain.tier_defaults import HOT_TIER_DEFAULT_BYTES


class BlockAwarePrefixCache:
    """Save and load a model's blocks by their hash: RAM first, then disk when configured.

    ``paged_cache`` gives the model's layer count (``kv_data`` may hold at most that many
    entries; ``num_layers`` when there is no paged cache) and, without
    ``paged_ssd_cache``, the RAM tier itself. ``paged_ssd_cache``, a manager for one
    model, keeps the blocks in its own RAM tier and on disk.
    """

    def __init__(
        self,
        *,
        block_size: int = 64,
        paged_cache: PagedCache | None = None,
        paged_ssd_cache: PagedSSDCacheManager | None = None,
        hot_cache_max_bytes: int | None = None,
        num_layers: int | None = None,
    ) -> None:
        if paged_ssd_cache is not None and paged_ssd_cache.block_size != block_size:
            raise ValueError(
                f"the SSD cache holds blocks of {paged_ssd_cache.block_size} tokens, "
                f"this prefix cache {block_size}"
            )
        self.block_size = block_size
        self.num_layers = paged_cache.num_layers if paged_cache is not None else num_layers
        if paged_ssd_cache is None:
            # RAM only: the paged cache's pool, or one of ``hot_cache_max_bytes``.
            if paged_cache is None:
                budget = (
                    HOT_TIER_DEFAULT_BYTES if hot_cache_max_bytes is None else hot_cache_max_bytes
                )
                paged_cache = PagedCache(budget, num_layers=num_layers, block_size=block_size)
            paged_ssd_cache = PagedSSDCacheManager(
                hot_cache_only=True, block_size=block_size, paged_cache=paged_cache
            )
        self.paged_cache = paged_cache
        self.paged_ssd_cache = paged_ssd_cache

    def save_block(self, block_hash: bytes, kv_data: Any, token_count: int) -> None:
        """Keep the block under ``block_hash``; the disk write (if any) happens in the background.

        ``kv_data`` is a list with one entry per layer: a ``(keys, values)`` tuple of MLX
        arrays of any shape and dtype, or a non-KV layer's ``state`` as mlx-lm's caches
        give it. ``token_count``: the tokens the block covers, at most the block size.
        """
        if (
            self.num_layers is not None
            and isinstance(kv_data, list | tuple)
            and len(kv_data) > self.num_layers
        ):
            raise ValueError(
                f"kv_data holds {len(kv_data)} layers; the model has {self.num_layers}"
            )
        self.paged_ssd_cache.save_block(block_hash, kv_data, token_count)

    def load_block(self, block_hash: bytes) -> list[Any] | None:
        """The block's entries as they were saved, from RAM or else disk; None when not cached."""
        return self.paged_ssd_cache.load_block(block_hash)

    def has_block(self, block_hash: bytes) -> bool:
        """Whether the block is cached (in RAM, on disk, or queued for disk); reads no file."""
        return self.paged_ssd_cache.has_block(block_hash)

    def list_blocks(self) -> list[BlockMetadata]:
        """The model's blocks on disk, least recently used first (empty without an SSD tier)."""
        return self.paged_ssd_cache.list_blocks()

    def stats(self) -> dict[str, Any]:
        """The tiers' counters (``PagedSSDCacheManager.stats``)."""
        return self.paged_ssd_cache.stats()
