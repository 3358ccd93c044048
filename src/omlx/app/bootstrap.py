"""The composition root (STYLE §3): the one place that builds adapters and wires them."""

from __future__ import annotations

import logging
import time
from typing import Any

from omlx.adapters.mlx.blas import describe_blas, load_optimized_blas
from omlx.app.container import Container
from omlx.app.generation import GenerationService
from omlx.app.settings import Settings

log = logging.getLogger(__name__)


def bootstrap(settings: Settings, **overrides: Any) -> Container:
    """Load the model, build the cache tiers and start the engine thread.

    ``overrides`` replace built parts in tests (``model=``, ``cold_tier=``).
    """
    load_optimized_blas()  # before the first import of mlx below
    log.info(describe_blas())
    from omlx.adapters.mlx.engine import EngineConfig, MLXEngine
    from omlx.adapters.mlx.loader import load_model

    closers = []
    model = overrides.get("model") or load_model(settings.model or None)
    prefix_cache = None
    cold_tier = None
    if not settings.cache_enabled:
        log.info("prefix cache: off (--no-cache)")
    elif not model.cache_supported:
        log.warning("prefix cache: off for %s: %s", model.model_id, model.cache_unsupported_reason)
    else:
        prefix_cache, cold_tier, cold_closers = _build_cache(settings, model, overrides)
        closers.extend(cold_closers)

    engine = MLXEngine(
        model,
        prefix_cache,
        EngineConfig(
            max_concurrent=settings.max_concurrent_requests,
            prefill_step_size=settings.prefill_step_size,
        ),
    )
    engine.start()
    closers.append(engine.stop)
    generation = GenerationService(
        engine,
        model,
        max_queued=settings.max_queued_requests,
        default_max_tokens=settings.default_max_tokens,
    )
    return Container(
        settings=settings,
        model=model,
        engine=engine,
        generation=generation,
        model_ids=frozenset({model.model_id}),
        started_at=int(time.time()),
        prefix_cache=prefix_cache,
        cold_tier=cold_tier,
        blas=describe_blas(),
        closers=closers,
    )


def _build_cache(settings: Settings, model: Any, overrides: dict[str, Any]):
    from omlx.adapters.mlx.kv_codec import MLXKVCodec
    from omlx.domain.blocks import NamespaceInfo
    from omlx.domain.hot_tier import HotTier
    from omlx.domain.keys import namespace_digest
    from omlx.domain.prefix_cache import PrefixCache

    namespace = NamespaceInfo(
        digest=namespace_digest(model.identity(settings.block_size)),
        model_name=model.model_id,
        model_path=str(model.path),
        block_size=settings.block_size,
        kv_dtype=model.kv_dtype,
        layer_count=model.layer_count,
    )
    hot = HotTier(settings.hot_cache_bytes)
    prefix_cache = PrefixCache(namespace=namespace, codec=MLXKVCodec(), hot=hot)
    log.info(
        "prefix cache: hot tier %s, block size %d, namespace %s",
        settings.hot_cache_max_size, settings.block_size, namespace.digest[:12],
    )
    return prefix_cache, None, []
