"""The typed bag of services the composition root builds and the routes use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from omlx.adapters.blockfiles.writer import BlockWriter  # the root's: Litestar reads these hints
from omlx.adapters.cold_folder import ColdFolder
from omlx.app.catalog import ModelSpec
from omlx.app.model_names import ModelNames
from omlx.app.normalize import PromptNormalizer
from omlx.app.pool import ModelPool, Served
from omlx.app.sealing import ReasoningSeal
from omlx.app.settings import Settings
from omlx.domain.responses import ResponseStore


@dataclass(slots=True)
class Container:
    settings: Settings
    pool: ModelPool  # the served models, loaded on demand
    names: ModelNames
    normalizer: PromptNormalizer
    seal: ReasoningSeal
    responses: ResponseStore  # stored Responses-API responses (index.db, or memory)
    started_at: int
    blas: str = ""
    writer: BlockWriter | None = None  # the cold tier's, shared by every model (its stats: metrics)
    ssd: ColdFolder | None = None  # the cold tier's folder, index and store (dashboard actions)
    closers: list[Callable[[], None]] = field(default_factory=list)
    # Models to load once the server listens (``omlx serve``: the port opens first).
    start_loads: list[ModelSpec] = field(default_factory=list)

    def close(self) -> None:
        """Stop in reverse order of start: engines first, then the writer and the index."""
        while self.closers:
            closer = self.closers.pop()
            closer()

    def health(self) -> dict[str, Any]:
        pool = self.pool
        models = {spec_id: self._model_health(spec_id) for spec_id in pool.specs}
        loaded = pool.loaded()
        first = next((s for s in loaded if s.task == "chat"), None)
        engine = {
            "active": sum(s.engine.active for s in loaded),
            "queued": sum(s.engine.queued for s in loaded),
        }
        account = pool.account
        return {
            "status": "ok",
            # False while a model named at start is still loading (requests wait for it).
            "ready": pool.ready and not self.start_loads,
            "model": first.id if first is not None else next(iter(pool.specs)),
            "engine": engine,
            "cache": models[first.id]["cache"] if first is not None else {"enabled": False},
            "models": models,
            "memory": {
                "max_model_memory": account.limit_bytes,
                "held": account.held(),
                "by_model": account.snapshot(),
            },
            "blas": self.blas,
        }

    def _model_health(self, model_id: str) -> dict[str, Any]:
        spec = self.pool.specs[model_id]
        out: dict[str, Any] = {"state": self.pool.state(model_id), "task": spec.task}
        if model_id in self.pool.load_errors:
            out["error"] = self.pool.load_errors[model_id]
        served = next((s for s in self.pool.loaded() if s.id == model_id), None)
        if served is None:
            return out
        out["engine"] = {"active": served.engine.active, "queued": served.engine.queued}
        out["weights_bytes"] = served.weights
        out["load_seconds"] = round(served.load_seconds, 3)
        if served.task == "chat":
            out["cache"] = _cache_health(self.settings, served)
        return out


def _cache_health(settings: Settings, served: Served) -> dict[str, Any]:
    model, prefix_cache = served.model, served.prefix_cache
    cache: dict[str, Any] = {"enabled": prefix_cache is not None}
    if model is not None and not model.cache_supported:
        cache["disabled_reason"] = model.cache_unsupported_reason
    elif not settings.cache_enabled:
        cache["disabled_reason"] = "turned off (--no-cache)"
    if model is not None and model.layout is not None:  # what each layer keeps: kv, window W, state
        cache["layout"] = model.layout.counts()
    if prefix_cache is not None:
        cache["block_size"] = settings.block_size
        stats = prefix_cache.stats()
        cache["hot"] = asdict(stats.hot)
        cache["restored"] = _restored(stats)
        cache["ssd"] = served.cold_tier is not None
    return cache


def _restored(stats: Any) -> dict[str, Any]:
    """What lookups restored, partial blocks included: ``hot.hits`` counts only whole
    blocks found in RAM, so a replay restored from partial blocks showed 0 hits there."""
    return {
        "lookups": stats.lookups,
        "tokens": stats.hit_tokens,
        "blocks_from_ram": stats.hot_hits,
        "blocks_from_disk": stats.cold_hits,
        "partial_blocks": stats.partial_hits,
        "partial_tokens": stats.partial_tokens,
    }
