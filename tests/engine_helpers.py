"""Drive an MLXEngine from a test thread: submit, wait, collect the text."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from omlx.domain.cache.blocks import CachedPrefix
from omlx.domain.generation import (
    Failed,
    Finished,
    GenerationRequest,
    PrefillStarted,
    SamplingParams,
    TextDelta,
)


@dataclass
class Run:
    events: list = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    job_id: int | None = None

    def emit(self, event) -> None:
        self.events.append(event)
        if isinstance(event, Finished | Failed):
            self.done.set()

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta))

    @property
    def finished(self) -> Finished:
        last = self.events[-1]
        assert isinstance(last, Finished), last
        return last

    @property
    def restored(self) -> CachedPrefix:
        """What the engine said it restored when the request started (its report's source),
        checked against what the request's usage says it restored."""
        (started,) = [e for e in self.events if isinstance(e, PrefillStarted)]
        assert started.restored is not None, "the engine ran without a prefix cache"
        assert started.restored.tokens == started.cached_tokens == self.finished.cached_tokens
        return started.restored


def greedy(tokens, max_tokens: int = 16, stop: tuple[str, ...] = ()) -> GenerationRequest:
    return GenerationRequest(tuple(tokens), max_tokens, SamplingParams(temperature=0.0), stop)


def submit(engine, request: GenerationRequest) -> Run:
    run = Run()
    run.job_id = engine.submit(request, run.emit)
    return run


def generate(engine, request: GenerationRequest, timeout: float = 120.0) -> Run:
    """Run to the end, including the engine storing the request's blocks after it."""
    run = submit(engine, request)
    assert run.done.wait(timeout), "generation timed out"
    deadline = time.monotonic() + timeout
    while not engine.settled(run.job_id):
        assert time.monotonic() < deadline, "the engine did not settle the request"
        time.sleep(0.002)
    return run
