"""``CacheConfig`` and ``CacheFactory``: the cache stack of a custom inference loop, in three calls.

``create_paged_cache`` makes the RAM tier for a model's layers, ``create_paged_ssd_cache``
the SSD tier in the model's own folder of the cache folder (None when no folder is
configured), ``create_prefix_cache`` the front that saves and loads blocks over both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omlx.cache.paged_cache import PagedCache
from omlx.cache.paged_ssd_cache import PagedSSDCacheManager
from omlx.cache.prefix_cache import BlockAwarePrefixCache
from omlx.domain.sizes import parse_size
from omlx.domain.tier_defaults import COLD_TIER_DEFAULT_BYTES, HOT_TIER_DEFAULT_BYTES


@dataclass(frozen=True)
class CacheConfig:
    """Settings of the cache stack; sizes are bytes, or strings such as ``"200GB"`` or ``"4GiB"``.

    ``paged_ssd_cache_dir``: the cache folder (the server's is ``~/.omlx/cache``); None
    keeps blocks in RAM only. ``max_paged_ssd_cache_size``: the folder's budget, for all
    its models together (default 100 GB). ``hot_cache_max_size``: the RAM tier's budget
    (default 2 GB). ``index_url``: a PostgreSQL index shared with servers, instead of
    ``<paged_ssd_cache_dir>/index.db``. ``block_store``: ``s3://bucket/prefix`` to keep the
    blocks in an object store (the folder keeps local copies; docs/multi-machine.md), as
    the server's ``--block-store``. ``block_size``: the most tokens one block covers;
    models at two block sizes never share blocks. The names are oMLX's (a loop written
    against oMLX's cache keeps its config); the server spells the budget
    ``paged_ssd_cache_max_size``.
    """

    block_size: int = 64
    paged_ssd_cache_dir: str | Path | None = None
    max_paged_ssd_cache_size: int | str = COLD_TIER_DEFAULT_BYTES
    hot_cache_max_size: int | str = HOT_TIER_DEFAULT_BYTES
    index_url: str | None = None
    block_store: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")
        self.ssd_bytes  # noqa: B018 - a bad size fails here, not at the first block
        self.hot_bytes  # noqa: B018

    @property
    def ssd_bytes(self) -> int:
        return parse_size(self.max_paged_ssd_cache_size)

    @property
    def hot_bytes(self) -> int:
        return parse_size(self.hot_cache_max_size)


class CacheFactory:
    """Builds the cache stack from a ``CacheConfig``."""

    @staticmethod
    def create_paged_cache(config: CacheConfig, num_layers: int) -> PagedCache:
        """The RAM tier for a model of ``num_layers`` layers, within ``hot_cache_max_size``."""
        return PagedCache(config.hot_bytes, num_layers=num_layers, block_size=config.block_size)

    @staticmethod
    def create_paged_ssd_cache(config: CacheConfig, model_name: str) -> PagedSSDCacheManager | None:
        """The SSD tier of ``model_name``'s blocks, or None when no cache folder is configured.

        Its files go to the model's own folder, ``<dir>/<model_name>-<namespace[:12]>/``.
        """
        if config.paged_ssd_cache_dir is None:
            return None
        return PagedSSDCacheManager(
            cache_dir=config.paged_ssd_cache_dir,
            max_size_bytes=config.ssd_bytes,
            hot_cache_max_bytes=config.hot_bytes,
            model_name=model_name,
            block_size=config.block_size,
            index_url=config.index_url,
            block_store=config.block_store,
        )

    @staticmethod
    def create_prefix_cache(
        config: CacheConfig,
        model: Any = None,
        paged_cache: PagedCache | None = None,
        paged_ssd_cache: PagedSSDCacheManager | None = None,
    ) -> BlockAwarePrefixCache:
        """The front that saves and loads blocks: over the SSD tier when given, else RAM only.

        ``model`` (optional, an mlx-lm model) bounds how many layers a block may hold when
        no ``paged_cache`` says so; nothing about it enters the keys, which are the caller's.
        """
        layers = getattr(model, "layers", None)
        return BlockAwarePrefixCache(
            block_size=config.block_size,
            paged_cache=paged_cache,
            paged_ssd_cache=paged_ssd_cache,
            hot_cache_max_bytes=config.hot_bytes,
            num_layers=len(layers) if layers is not None else None,
        )
