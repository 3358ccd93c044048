"""The typed bag of services the composition root builds and the routes use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from omlx.adapters.blockfiles.writer import BlockWriter  # the root's: Litestar reads these hints
from omlx.adapters.cold_folder import ColdFolder
from omlx.app.cache_controls.maintenance import CacheMaintenance
from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.observers import Observers
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.models.catalog import ModelSpec
from omlx.app.models.model_names import ModelNames
from omlx.app.models.pool import ModelPool
from omlx.app.settings import Settings
from omlx.app.stop_signal import StopSignal
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
    stop: StopSignal = field(default_factory=StopSignal)  # the server's stop (SIGINT, SIGTERM)
    blas: str = ""
    writer: BlockWriter | None = None  # the cold tier's, shared by every model (its stats: metrics)
    ssd: ColdFolder | None = None  # the cold tier's folder, index and store
    maintenance: CacheMaintenance | None = None  # clearing and vacuuming it (the dashboard)
    observers: Observers = field(default_factory=Observers)  # metrics, request log listen
    closers: list[Callable[[], None]] = field(default_factory=list)
    # Models to load once the server listens (``omlx serve``: the port opens first).
    start_loads: list[ModelSpec] = field(default_factory=list)

    def close(self) -> None:
        """Stop in reverse order of start: engines first, then the writer and the index."""
        while self.closers:
            closer = self.closers.pop()
            closer()
