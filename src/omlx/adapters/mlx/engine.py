"""The generation engine: one thread owns MLX and runs mlx-lm's continuous batcher.

Requests arrive through a thread-safe inbox; events leave through each
request's ``emit`` callback (the app bridges them to its event loop). Restored
prefixes enter the batch as ready caches, so only the uncached tail is prefilled.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from omlx.adapters.mlx.loader import LoadedModel
from omlx.adapters.mlx.sampling import make_sampler
from omlx.domain.generation import (
    Failed,
    Finished,
    GenerationEvent,
    GenerationRequest,
    PrefillProgress,
    PrefillStarted,
    StopStringMatcher,
    TextDelta,
)

if TYPE_CHECKING:
    from omlx.domain.prefix_cache import PrefixCache, PrefixHit

log = logging.getLogger(__name__)

Emit = Callable[[GenerationEvent], None]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_concurrent: int = 8
    prefill_step_size: int = 256


@dataclass(slots=True)
class _Job:
    """One request's life on the engine thread."""

    id: int
    request: GenerationRequest
    emit: Emit
    submitted: float
    uid: int | None = None
    hit: PrefixHit | None = None
    detok: Any = None
    stops: StopStringMatcher | None = None
    cached_tokens: int = 0
    completion_tokens: int = 0
    done: bool = False
    times: dict[str, float] = field(default_factory=dict)


class MLXEngine:
    """Owns the model, the batcher and the prefix cache; everything MLX runs on its thread."""

    def __init__(
        self,
        model: LoadedModel,
        prefix_cache: PrefixCache | None,
        config: EngineConfig | None = None,
    ) -> None:
        self.model = model
        self.prefix_cache = prefix_cache
        self.config = config or EngineConfig()
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._waiting: deque[_Job] = deque()
        self._running: dict[int, _Job] = {}  # batcher uid -> job
        self._jobs: dict[int, _Job] = {}  # job id -> job (waiting or running)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._generator: BatchGenerator | None = None
        self._eos = sorted(model.tokenizer.eos_token_ids)
        self.queued = 0  # submitted but not yet admitted into the batch (read by the app)
        self.active = 0  # in the batch
        self.last_step_at = time.monotonic()

    # ---- any thread -------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="omlx-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, request: GenerationRequest, emit: Emit) -> int:
        """Queue a request; returns its id for ``cancel``."""
        job_id = next(self._ids)
        self.queued += 1
        self._inbox.put(("submit", _Job(job_id, request, emit, time.monotonic())))
        return job_id

    def cancel(self, job_id: int) -> None:
        self._inbox.put(("cancel", job_id))

    # ---- engine thread ----------------------------------------------------

    def _run(self) -> None:
        self._generator = self._new_generator()
        while not self._stopping.is_set():
            busy = bool(self._running)
            self._drain_inbox(block=not busy and not self._waiting)
            self._admit_waiting()
            if not self._running:
                continue
            try:
                self._step()
            except Exception as exc:  # a failed step must not kill the server
                log.exception("engine step failed")
                self._fail_all(f"generation failed: {exc}")
        for job in list(self._jobs.values()):
            self._finish(job, "cancelled", cache=None, tokens=None)

    def _new_generator(self) -> BatchGenerator:
        return BatchGenerator(
            self.model.model,
            completion_batch_size=self.config.max_concurrent,
            prefill_batch_size=self.config.max_concurrent,
            prefill_step_size=self.config.prefill_step_size,
        )

    def _drain_inbox(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = command
            if kind == "submit":
                self._jobs[arg.id] = arg
                self._waiting.append(arg)
            elif kind == "cancel":
                job = self._jobs.get(arg)
                if job is not None:
                    self._cancel(job)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit_waiting(self) -> None:
        """First come, first served, up to ``max_concurrent`` in the batch."""
        while self._waiting and len(self._running) < self.config.max_concurrent:
            job = self._waiting.popleft()
            self.queued -= 1
            try:
                self._admit(job)
            except Exception as exc:
                log.exception("could not admit request %d", job.id)
                self._release(job)
                self._jobs.pop(job.id, None)
                job.emit(Failed(f"could not start generation: {exc}"))

    def _admit(self, job: _Job) -> None:
        tokens = list(job.request.prompt_tokens)
        cache = None
        if self.prefix_cache is not None:
            job.hit = self.prefix_cache.lookup(tokens)
            job.cached_tokens = job.hit.cached_tokens
            if job.cached_tokens:
                cache = self.prefix_cache.restore(job.hit)
        job.times["admitted"] = time.monotonic()
        params = job.request.sampling
        (job.uid,) = self._generator.insert(
            [tokens[job.cached_tokens :]],
            max_tokens=[job.request.max_tokens],
            caches=[cache],
            all_tokens=[tokens[: job.cached_tokens]],
            samplers=[make_sampler(params.temperature, params.top_p, params.top_k, params.seed)],
            stop_sequences=[StopSequences([[t] for t in self._eos])],
        )
        job.detok = self.model.tokenizer.detokenizer
        job.stops = StopStringMatcher(job.request.stop)
        self._running[job.uid] = job
        self.active = len(self._running)
        job.emit(PrefillStarted(job.cached_tokens, len(tokens)))

    def _step(self) -> None:
        prompt_responses, generation_responses = self._generator.next()
        self.last_step_at = time.monotonic()
        for r in prompt_responses:
            job = self._running.get(r.uid)
            if job is not None and not r.end_of_prompt:
                done, total = r.progress
                job.emit(PrefillProgress(done + job.cached_tokens, total + job.cached_tokens))
        for r in generation_responses:
            job = self._running.get(r.uid)
            if job is None or job.done:
                continue
            self._on_token(job, r)

    def _on_token(self, job: _Job, r: Any) -> None:
        if "first_token" not in job.times:
            job.times["first_token"] = time.monotonic()
        is_eos = r.finish_reason == "stop"
        if not is_eos:
            job.completion_tokens += 1
            job.detok.add_token(r.token)
            text = job.stops.feed(job.detok.last_segment)
            if text:
                job.emit(TextDelta(text))
        if job.stops.stopped:
            removed = self._generator.remove([job.uid], return_prompt_caches=True)
            cache, tokens = removed.get(job.uid, (None, None))
            self._finish(job, "stop", cache, tokens)
        elif r.finish_reason is not None:
            job.detok.finalize()
            tail = job.stops.feed(job.detok.last_segment) + job.stops.flush()
            if tail:
                job.emit(TextDelta(tail))
            reason = "stop" if job.stops.stopped else r.finish_reason
            self._finish(job, reason, r.prompt_cache, r.all_tokens)

    def _finish(self, job: _Job, reason: str, cache: Any, tokens: list[int] | None) -> None:
        job.done = True
        if cache is not None and tokens and self.prefix_cache is not None:
            try:
                self.prefix_cache.store(tokens, cache)
            except Exception:
                log.exception("could not store the blocks of request %d", job.id)
        self._release(job)
        self._running.pop(job.uid, None)
        self._jobs.pop(job.id, None)
        self.active = len(self._running)
        job.emit(
            Finished(reason, len(job.request.prompt_tokens), job.completion_tokens, job.cached_tokens)
        )

    def _cancel(self, job: _Job) -> None:
        if job.uid is None:
            self._waiting.remove(job)
            self.queued -= 1
        else:
            self._generator.remove([job.uid])
        self._finish(job, "cancelled", cache=None, tokens=None)

    def _release(self, job: _Job) -> None:
        if job.hit is not None and self.prefix_cache is not None:
            self.prefix_cache.release(job.hit)
            job.hit = None

    def _fail_all(self, message: str) -> None:
        for job in list(self._running.values()):
            self._release(job)
            self._jobs.pop(job.id, None)
            job.emit(Failed(message))
        self._running.clear()
        self.active = 0
        self._generator = self._new_generator()
        mx.clear_cache()
