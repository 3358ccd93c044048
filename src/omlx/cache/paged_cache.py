"""The RAM tier of the library API: caller-keyed blocks in the domain's hot tier (LRU, byte budget)."""

from __future__ import annotations

from typing import Any

from omlx.cache.layers import shared
from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.hot_tier import HotTier, HotTierStats
from omlx.domain.cache.keys import EXTERNAL


class PagedCache:
    """Blocks in RAM, named by their caller's hash, within ``max_bytes``; least recently used go first.

    ``num_layers``, when given, is the model's layer count: a block holds at most that
    many entries. ``block_size`` is the most tokens one block covers. The arrays held are
    the compact copies ``layers.compact`` made; a hit hands out new array objects over
    them, so neither side's later writes reach the other.
    """

    def __init__(
        self, max_bytes: int, *, num_layers: int | None = None, block_size: int = 64
    ) -> None:
        if num_layers is not None and num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.hot = HotTier(max_bytes)
        self.num_layers = num_layers
        self.block_size = block_size

    @property
    def max_bytes(self) -> int:
        return self.hot.max_bytes

    def put(self, block_hash: bytes, layers: list[Any], nbytes: int, token_count: int) -> bool:
        """Keep ``layers`` (compact, evaluated); False when they do not fit the budget."""
        name = block_hash.hex()
        meta = BlockMeta(name, name, "", token_count, EXTERNAL)
        return self.hot.put(meta, (), layers, nbytes)

    def get(self, block_hash: bytes) -> list[Any] | None:
        """The block's entries (new array objects, same buffers), marked most recently used."""
        block = self.hot.get(block_hash.hex())
        return None if block is None else shared(block.payload)

    def touch(self, block_hash: bytes) -> bool:
        """Mark the block most recently used, counting no hit; False when it is not in RAM."""
        return self.hot.touch(block_hash.hex())

    def __contains__(self, block_hash: object) -> bool:
        return isinstance(block_hash, bytes) and block_hash.hex() in self.hot

    def __len__(self) -> int:
        return len(self.hot)

    def stats(self) -> HotTierStats:
        return self.hot.stats()

    def clear(self) -> None:
        """Drop every block from RAM (blocks on disk stay)."""
        self.hot.clear()
