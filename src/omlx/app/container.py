"""The typed bag of services the composition root builds and the routes use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omlx.app.chat import ChatPipeline
from omlx.app.model_names import ModelNames
from omlx.app.normalize import PromptNormalizer
from omlx.app.sealing import ReasoningSeal
from omlx.app.service import GenerationService
from omlx.app.settings import Settings
from omlx.domain.responses import ResponseStore


@dataclass(slots=True)
class Container:
    settings: Settings
    model: Any  # LoadedModel
    engine: Any  # MLXEngine
    generation: GenerationService
    chat: ChatPipeline
    names: ModelNames
    normalizer: PromptNormalizer
    seal: ReasoningSeal
    responses: ResponseStore  # stored Responses-API responses (index.db, or memory)
    started_at: int
    prefix_cache: Any = None  # PrefixCache | None
    cold_tier: Any = None  # ColdTier | None
    blas: str = ""
    metrics: Any = None  # api.metrics.Metrics, set by create_app (one registry per app)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Stop in reverse order of start: engine first, then the writer and the index."""
        while self.closers:
            closer = self.closers.pop()
            closer()

    def health(self) -> dict[str, Any]:
        model = self.model
        cache: dict[str, Any] = {"enabled": self.prefix_cache is not None}
        if not model.cache_supported:
            cache["disabled_reason"] = model.cache_unsupported_reason
        elif not self.settings.cache_enabled:
            cache["disabled_reason"] = "turned off (--no-cache)"
        layout = getattr(model, "layout", None)
        if layout is not None:  # what each layer keeps: kv, window W, state
            cache["layout"] = layout.counts()
        if self.prefix_cache is not None:
            cache["block_size"] = self.settings.block_size
            cache["hot"] = _asdict(self.prefix_cache.hot.stats())
            cache["ssd"] = self.cold_tier is not None
        return {
            "status": "ok",
            "model": model.model_id,
            "engine": {"active": self.engine.active, "queued": self.engine.queued},
            "cache": cache,
            "blas": self.blas,
        }


def _asdict(value: Any) -> dict[str, Any]:
    from dataclasses import asdict, is_dataclass

    return asdict(value) if is_dataclass(value) else dict(value)
