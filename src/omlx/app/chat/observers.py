"""Who hears what every served model does: one hub, given to each model's services when
they are built, that the app's metrics and request log subscribe to.

Models are loaded and unloaded while the server runs; the listeners are made once, with the
app. The hub lets neither side be patched after construction: a service holds its model's
``ModelObservers`` from the start, and a listener added later hears every model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from omlx.domain.generation import Finished


class GenerationObserver(Protocol):
    """Told about every generation (metrics)."""

    def first_token(self, seconds: float) -> None: ...

    def finished(self, event: Finished) -> None: ...

    def cancelled(self) -> None: ...


class CacheMissObserver(Protocol):
    """Told of each prefix-cache miss a turn's diagnosis finds, by kind, and of each request's
    cache report, by outcome and by how much it restored (metrics)."""

    def cache_miss(self, kind: str) -> None: ...

    def cache_reported(self, outcome: str, restored: str) -> None: ...


# Told of each finished generation: the model, the event, its TTFT and decode seconds.
FinishedRecorder = Callable[[str, Finished, "float | None", float], object]


class Observers:
    """The listeners of every model's generations and cache misses."""

    def __init__(self) -> None:
        self.generations: list[GenerationObserver] = []
        self.misses: list[CacheMissObserver] = []
        self.recorders: list[FinishedRecorder] = []

    def for_model(self, model_id: str) -> ModelObservers:
        return ModelObservers(self, model_id)


class ModelObservers:
    """One model's view of the hub: what its generation service and chat pipeline call."""

    def __init__(self, hub: Observers, model_id: str) -> None:
        self._hub, self.model_id = hub, model_id

    def first_token(self, seconds: float) -> None:
        for observer in self._hub.generations:
            observer.first_token(seconds)

    def finished(self, event: Finished) -> None:
        for observer in self._hub.generations:
            observer.finished(event)

    def cancelled(self) -> None:
        for observer in self._hub.generations:
            observer.cancelled()

    def cache_miss(self, kind: str) -> None:
        for observer in self._hub.misses:
            observer.cache_miss(kind)

    def cache_reported(self, outcome: str, restored: str) -> None:
        for observer in self._hub.misses:
            observer.cache_reported(outcome, restored)

    def completed(self, event: Finished, ttft_s: float | None, decode_s: float) -> None:
        """A generation finished, with its timings (the dashboard's request log)."""
        for record in self._hub.recorders:
            record(self.model_id, event, ttft_s, decode_s)
