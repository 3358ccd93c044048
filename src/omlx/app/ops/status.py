"""One read of the server's numbers, from which ``/health``, the dashboard and ``/metrics``
are all drawn, so the three never disagree about what they count.

``ServerStatus.read()`` takes each component's frozen stats once (the pool, each loaded
model's engine and prefix cache, the cold tier's writer) into a ``ServerState``; the
three views only arrange it. Nothing here touches the engine thread or the index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from omlx import __version__
from omlx.domain.cache.cold_tier import ColdTierStats
from omlx.domain.cache.cold_writes import WriterStats
from omlx.domain.cache.prefetch import OFF, PrefetchProgress
from omlx.domain.cache.tally import PrefixCacheStats
from omlx.domain.startup import STARTUP

if TYPE_CHECKING:
    from omlx.app.models.pool import Served
    from omlx.app.wiring.container import Container


@dataclass(frozen=True, slots=True)
class CacheState:
    """A loaded chat model's prefix cache: why it is off, or its layout and counters."""

    enabled: bool
    disabled_reason: str | None = None
    layout: dict[str, int] | None = None  # what each layer keeps: kv, window W, state
    namespace: str | None = None
    block_size: int | None = None
    stats: PrefixCacheStats | None = None
    cold: ColdTierStats | None = None  # its cold tier's counters; None: no SSD tier
    warm_restart: PrefetchProgress | None = None  # the start's prefetch; state "off" when off


@dataclass(frozen=True, slots=True)
class ModelState:
    id: str
    task: str
    state: str  # loaded | loading | available
    pinned: bool
    source: str
    error: str | None
    weights_bytes: int = 0
    kv_bytes: int = 0
    active: int = 0
    queued: int = 0
    loaded: bool = False
    load_seconds: float = 0.0
    kv_bytes_per_token: int | None = None
    cache: CacheState | None = None  # loaded chat models
    # A vision-language model's image rows (its encoder's output, kept in the cache's
    # tiers): images and bytes held in RAM, encoder passes, hits by tier, queued for SSD;
    # None: a text model.
    images: dict[str, int | bool] | None = None


@dataclass(frozen=True, slots=True)
class ServerState:
    version: str
    uptime_s: float
    ready: bool  # no model named at start is still loading
    waiting_for: tuple[str, ...]  # while not ready: the start-up steps under way
    blas: str
    models: tuple[ModelState, ...]
    memory_limit: int | None
    memory_held: int
    memory_by_model: dict[str, dict[str, int]]
    loads: int
    normalizations: dict[str, int]
    writer: WriterStats | None  # the shared cold-tier writer's counters; None: no SSD tier

    def model(self, model_id: str) -> ModelState:
        return next(m for m in self.models if m.id == model_id)


class ServerStatus:
    """Reads the server's state from its container (any thread; cheap: counters only)."""

    def __init__(self, container: Container) -> None:
        self._container = container

    def read(self) -> ServerState:
        c = self._container
        pool = c.pool
        loaded = {s.id: s for s in pool.loaded()}
        held = pool.account.snapshot()
        models = tuple(
            _model(c, spec_id, loaded.get(spec_id), held.get(spec_id)) for spec_id in pool.specs
        )
        return ServerState(
            version=__version__,
            uptime_s=round(time.time() - c.started_at, 1),
            ready=pool.ready and not c.start_loads,
            # A load named at start and not begun yet is a step too.
            waiting_for=tuple(STARTUP.waiting_for() or [f"loading {s.id}" for s in c.start_loads]),
            blas=c.blas,
            models=models,
            memory_limit=pool.account.limit_bytes,
            memory_held=pool.account.held(),
            memory_by_model=held,
            loads=pool.loads,
            normalizations=dict(c.normalizer.applied()),
            writer=c.writer.stats() if c.writer is not None else None,
        )


def _model(
    c: Container, model_id: str, served: Served | None, held: dict[str, int] | None
) -> ModelState:
    pool = c.pool
    spec = pool.specs[model_id]
    base = ModelState(
        id=model_id,
        task=spec.task,
        state=pool.state(model_id),
        pinned=model_id in pool.pinned,
        source=spec.label,
        error=pool.load_errors.get(model_id),
        weights_bytes=held["weights"] if held else 0,
        kv_bytes=held["kv"] if held else 0,
    )
    if served is None:
        return base
    return replace(
        base,
        active=served.engine.active,
        queued=served.engine.queued,
        loaded=True,
        load_seconds=served.load_seconds,
        kv_bytes_per_token=served.kv_bytes_per_token,
        cache=_cache(c, served) if served.task == "chat" else None,
        images=_images(served),
    )


def _images(served: Served) -> dict[str, int | bool] | None:
    generation = getattr(served, "generation", None)
    images = getattr(generation, "images", None)
    return images.stats() if images is not None else None


def _cache(c: Container, served: Served) -> CacheState:
    model, prefix_cache = served.model, served.prefix_cache
    reason = None
    if model is not None and not model.cache_supported:
        reason = model.cache_unsupported_reason
    elif not c.settings.cache_enabled:
        reason = "turned off (--no-cache)"
    layout = model.layout.counts() if model is not None and model.layout is not None else None
    if prefix_cache is None:
        return CacheState(False, reason, layout)
    cold = served.cold_tier
    return CacheState(
        True,
        reason,
        layout,
        namespace=prefix_cache.namespace.digest,
        block_size=prefix_cache.block_size,
        stats=prefix_cache.stats(),
        cold=cold.stats() if cold is not None else None,
        warm_restart=(
            served.warm_restart.progress()
            if served.warm_restart is not None
            else PrefetchProgress(OFF)
        ),
    )
