"""The generation engine: one thread owns MLX and runs mlx-lm's continuous batcher.

Requests arrive through a thread-safe inbox; events leave through each
request's ``emit`` callback (the app bridges them to its event loop). Restored
prefixes enter the batch as ready caches, so only the uncached tail is prefilled.

Scheduling: first come, first served into a batch of at most ``max_concurrent``.
Each ``BatchGenerator.next()`` runs one decode step for the running streams and
then one chunk (``prefill_step_size`` tokens per prompt) of the prompts being
prefilled, so streams keep producing tokens while a long prompt is prefilled; a
short prompt that joins a long one's prefill batch moves to decoding as soon as
its own tokens are done. A memory guard (``memory.KVBudget``) admits a request
only when its KV fits beside the running ones, shrinking the hot tier first.
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

from omlx.adapters.mlx import batch_rows
from omlx.adapters.mlx.loader import LoadedModel
from omlx.adapters.mlx.memory import KVBudget, format_bytes, measure_kv_cost
from omlx.adapters.mlx.processors import request_processors, token_logprob
from omlx.adapters.mlx.sampling import Sampler, make_sampler
from omlx.domain.generation import (
    Failed,
    Finished,
    GenerationEvent,
    GenerationRequest,
    PrefillProgress,
    PrefillStarted,
    StopStringMatcher,
    TextDelta,
    TokenLogprob,
)

if TYPE_CHECKING:
    from omlx.domain.capture import RequestCapture
    from omlx.domain.prefix_cache import PrefixCache, PrefixHit

log = logging.getLogger(__name__)

Emit = Callable[[GenerationEvent], None]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_concurrent: int = 8
    prefill_step_size: int = 256
    # Bytes of KV for the running requests plus the hot tier; None: no memory guard.
    kv_memory_limit: int | None = None


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
    fed_tokens: int = 0  # generated tokens fed back to the model (the cache holds them)
    hit_lost: int = 0  # KV-matched tokens recomputed for want of a restore point (hybrids)
    capture: RequestCapture | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet sent with a delta
    done: bool = False
    waited_epoch: int = -1  # the batch state in which it last had to wait for memory
    times: dict[str, float] = field(default_factory=dict)

    @property
    def length(self) -> int:
        """Cache positions it may reach: its prompt plus every token it may generate."""
        return len(self.request.prompt_tokens) + self.request.max_tokens


_ADMIT, _WAIT, _REFUSE = "admit", "wait", "refuse"


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
        # One object shared by every request: the batcher builds a matcher per row.
        self._stop_tokens = StopSequences([[t] for t in self._eos])
        # Unseeded samplers are stateless: requests with equal parameters share one
        # object, so the batcher samples them in one call instead of row by row.
        self._samplers: dict[tuple[float, float, int, float], Sampler] = {}
        # Measured now, before the engine thread owns MLX (one forward of one token).
        limit = self.config.kv_memory_limit
        cost = measure_kv_cost(model.model) if limit is not None else None
        self.budget = KVBudget(limit, cost.per_token, cost) if cost is not None else None
        self._epoch = 0  # bumped whenever the running set changes (memory verdicts expire)
        self._memory_blocked = False  # the head of the queue waits for KV memory
        self._count_lock = threading.Lock()
        self._submitted = 0  # written under the lock by submitters
        self._dequeued = 0  # written by the engine thread only
        self.active = 0  # in the batch
        self.last_step_at = time.monotonic()

    @property
    def queued(self) -> int:
        """Requests waiting for a batch slot (read by the app for 429s, /health, metrics).

        Submitted but not yet admitted, less those that free slots will take at the
        engine's next look: two requests arriving together at an idle server do not
        count as a queue. While the head of the queue waits for memory, all of them do.
        """
        pending = self._submitted - self._dequeued
        if self._memory_blocked:
            return pending
        return max(0, pending - max(0, self.config.max_concurrent - self.active))

    @property
    def kv_token_capacity(self) -> int | None:
        """The most positions (prompt + max_tokens) one request may use; None: no guard."""
        return None if self.budget is None else self.budget.token_capacity

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
        with self._count_lock:
            self._submitted += 1
        self._inbox.put(("submit", _Job(job_id, request, emit, time.monotonic())))
        return job_id

    def settled(self, job_id: int) -> bool:
        """Whether the engine is wholly done with a job, its blocks stored (for tests and tools)."""
        return job_id not in self._jobs

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
            # Every admitted prompt joins the prefill batch at once: a short prompt
            # beside a long one is split off to decode after its own last chunk.
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
                if job is not None and not job.done:
                    self._cancel(job)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit_waiting(self) -> None:
        """First come, first served, up to ``max_concurrent`` in the batch and within the KV limit.

        The head of the queue waits for memory rather than being overtaken, so a large
        request is never starved by a stream of small ones.
        """
        while self._waiting and len(self._running) < self.config.max_concurrent:
            job = self._waiting[0]
            verdict = self._memory_verdict(job)
            self._memory_blocked = verdict == _WAIT
            if verdict == _WAIT:
                return
            self._waiting.popleft()
            self._dequeued += 1
            if verdict == _REFUSE:
                self._refuse(job)
                continue
            try:
                self._admit(job)
            except Exception as exc:
                log.exception("could not admit request %d", job.id)
                self._release(job)
                self._jobs.pop(job.id, None)
                job.emit(Failed(f"could not start generation: {exc}"))

    def _memory_verdict(self, job: _Job) -> str:
        """Admit, wait (fits alone, not beside the running ones) or refuse (never fits)."""
        budget = self.budget
        if budget is None:
            return _ADMIT
        if not budget.fits_alone(job.length):
            return _REFUSE
        if job.waited_epoch == self._epoch:
            return _WAIT  # nothing finished since the last look
        need = budget.batch_bytes([j.length for j in self._running.values()] + [job.length])
        if need > budget.limit_bytes:
            return self._wait(job, need, "the running requests")
        hot = self.prefix_cache.hot if self.prefix_cache is not None else None
        room = budget.limit_bytes - need
        if hot is not None and hot.stats().bytes > room:
            if job.hit is None:  # pin its own prefix first: the shrink must not evict it
                job.hit = self.prefix_cache.lookup(job.request.prompt_tokens)
            freed = hot.shrink(room)
            if freed:
                log.info("memory guard: the hot tier gave back %s for request %d", format_bytes(freed), job.id)
            if hot.stats().bytes > room and self._running:
                return self._wait(job, need, "the running requests and pinned cache blocks")
        return _ADMIT

    def _wait(self, job: _Job, need: int, beside: str) -> str:
        if job.waited_epoch < 0:
            log.info(
                "memory guard: request %d waits: %s of KV beside %s exceeds kv_memory_limit %s",
                job.id, format_bytes(need), beside, format_bytes(self.budget.limit_bytes),
            )
        job.waited_epoch = self._epoch
        return _WAIT

    def _refuse(self, job: _Job) -> None:
        budget = self.budget
        prompt, new = len(job.request.prompt_tokens), job.request.max_tokens
        self._release(job)
        self._jobs.pop(job.id, None)
        job.emit(
            Failed(
                f"this request needs {format_bytes(budget.batch_bytes([job.length]))} of KV cache "
                f"({prompt} prompt + {new} max_tokens tokens), more than kv_memory_limit "
                f"({format_bytes(budget.limit_bytes)}) allows; at most {budget.token_capacity} "
                "tokens in all: lower max_tokens or shorten the prompt"
            )
        )

    def _sampler(self, params: Any) -> Sampler:
        if params.seed is not None:
            return make_sampler(params.temperature, params.top_p, params.top_k, params.seed, params.min_p)
        key = (params.temperature, params.top_p, params.top_k, params.min_p) if params.temperature > 0 else (0.0, 1.0, 0, 0.0)
        sampler = self._samplers.get(key)
        if sampler is None:
            if len(self._samplers) >= 64:  # clients choose the floats: keep the memo small
                self._samplers.clear()
            sampler = self._samplers[key] = make_sampler(*key[:3], min_p=key[3])
        return sampler

    def _admit(self, job: _Job) -> None:
        tokens = list(job.request.prompt_tokens)
        cache = None
        if self.prefix_cache is not None:
            if job.hit is None:
                job.hit = self.prefix_cache.lookup(tokens)
            job.cached_tokens = job.hit.cached_tokens
            job.hit_lost = job.hit.lost_tokens
            if job.cached_tokens:
                cache = self.prefix_cache.restore(job.hit)
            job.capture = self.prefix_cache.capture(tokens, job.hit)
        job.times["admitted"] = time.monotonic()
        plan = job.capture.plan if job.capture is not None else ()
        (job.uid,) = self._generator.insert_segments(
            [self._segments(tokens, job.cached_tokens, plan)],
            max_tokens=[job.request.max_tokens],
            caches=[cache],
            all_tokens=[tokens[: job.cached_tokens]],
            samplers=[self._sampler(job.request.sampling)],
            logits_processors=[request_processors(job.request, self._eos)],
            stop_sequences=[self._stop_tokens],
        )
        job.detok = self.model.tokenizer.detokenizer
        job.stops = StopStringMatcher(job.request.stop)
        self._running[job.uid] = job
        self._epoch += 1
        self.active = len(self._running)
        job.emit(PrefillStarted(job.cached_tokens, len(tokens)))

    def _segments(self, tokens: list[int], start: int, plan: tuple[int, ...]) -> list[list[int]]:
        """The uncached tail, cut so that every prefill chunk ends on a block boundary.

        mlx-lm's batcher never lets a chunk span two segments and reports each segment's
        end: segments end at multiples of the chunk size (a multiple of the block size)
        and at the restore points the request's capture plans.
        """
        if self.prefix_cache is None:
            return [tokens[start:]]
        bs = self.prefix_cache.block_size
        step = bs * max(1, self.config.prefill_step_size // bs)
        cuts = set(range((start // step + 1) * step, len(tokens), step))
        cuts.update(p for p in plan if start < p < len(tokens))
        edges = [start, *sorted(cuts), len(tokens)]
        return [tokens[a:b] for a, b in itertools.pairwise(edges) if b > a]

    def _step(self) -> None:
        prompt_responses, generation_responses = self._generator.next()
        self.last_step_at = time.monotonic()
        for r in prompt_responses:
            job = self._running.get(r.uid)
            if job is not None and not r.end_of_prompt:
                done, total = r.progress
                job.emit(PrefillProgress(done + job.cached_tokens, total + job.cached_tokens))
                if r.end_of_segment and job.capture is not None:
                    self._capture(job, batch_rows.prefill_row, job.cached_tokens + done, prefill=True)
        for r in generation_responses:
            job = self._running.get(r.uid)
            if job is None or job.done:
                continue
            self._on_token(job, r)

    def _capture(self, job: _Job, row_of: Callable[..., Any], position: int, prefill: bool) -> None:
        """Keep what a running request's cache holds up to ``position`` (never fails it)."""
        started = time.perf_counter()
        try:
            view = row_of(self._generator, job.uid)
            if view is None:
                return
            if prefill:
                job.capture.prefilled(view, position)
            else:
                job.capture.decoded(view, position)
        except Exception:
            log.exception("could not keep the blocks of request %d at position %d", job.id, position)
            job.capture = None  # stop trying; what was kept stays
        finally:
            self.prefix_cache.record_store(time.perf_counter() - started)

    def _on_token(self, job: _Job, r: Any) -> None:
        if "first_token" not in job.times:
            job.times["first_token"] = time.monotonic()
        job.fed_tokens += 1
        if r.finish_reason is None and job.capture is not None:
            position = len(job.request.prompt_tokens) + job.fed_tokens
            if job.capture.wants_decoded(position):
                self._capture(job, batch_rows.decode_row, position, prefill=False)
        is_eos = r.finish_reason == "stop"
        if not is_eos:
            job.completion_tokens += 1
            if job.request.logprobs is not None:
                job.logprobs.append(token_logprob(r.token, r.logprobs, job.request.logprobs))
            job.detok.add_token(r.token)
            text = job.stops.feed(job.detok.last_segment)
            if text:
                self._emit_text(job, text)
        if job.stops.stopped:
            if job.logprobs:
                self._emit_text(job, "")
            removed = self._generator.remove([job.uid], return_prompt_caches=True)
            cache, tokens = removed.get(job.uid, (None, None))
            self._finish(job, "stop", cache, tokens)
        elif r.finish_reason is not None:
            job.detok.finalize()
            tail = job.stops.feed(job.detok.last_segment) + job.stops.flush()
            if tail or job.logprobs:
                self._emit_text(job, tail)
            reason = "stop" if job.stops.stopped else r.finish_reason
            self._finish(job, reason, r.prompt_cache, r.all_tokens)

    @staticmethod
    def _emit_text(job: _Job, text: str) -> None:
        """A text delta, with the log-probabilities of the tokens since the previous one."""
        job.emit(TextDelta(text, tuple(job.logprobs)))
        job.logprobs.clear()

    def _finish(self, job: _Job, reason: str, cache: Any, tokens: list[int] | None) -> None:
        """Unpin its prefix and drop its KV, tell the client, then store its new blocks.

        The client hears first: cutting blocks waits for the batch's in-flight decode
        step, time no response should wait for. The job stays listed (``settled`` is
        False) until its blocks are stored, and the next command is read only after.
        """
        job.done = True
        self._release(job)
        if job.uid is not None and self._running.pop(job.uid, None) is not None:
            self._epoch += 1
        self.active = len(self._running)
        job.emit(
            Finished(
                reason,
                len(job.request.prompt_tokens),
                job.completion_tokens,
                job.cached_tokens,
                job.stops.matched if job.stops is not None else None,
            )
        )
        self._log_finished(job, reason)
        if cache is not None and tokens and self.prefix_cache is not None:
            started = time.perf_counter()
            try:
                if job.capture is not None:
                    job.capture.finished(tokens, cache)
                else:
                    self.prefix_cache.store(tokens, cache)
            except Exception:
                log.exception("could not store the blocks of request %d", job.id)
            finally:
                self.prefix_cache.record_store(time.perf_counter() - started)
        self._jobs.pop(job.id, None)
        if not self._running:
            mx.clear_cache()  # idle: hand the freed KV buffers back, not just to MLX's pool

    def _log_finished(self, job: _Job, reason: str) -> None:
        """One line per request: what it cost, what the cache saved, how long it waited."""
        t = job.times
        first = t.get("first_token")
        ttft = f"{first - job.submitted:.3f} s" if first is not None else "-"
        waited = f"{t['admitted'] - job.submitted:.3f} s" if "admitted" in t else "-"
        lost = job.hit_lost if job.hit_lost else 0
        log.info(
            "request %d %s: prompt %d tokens, %d cached%s, %d generated; queued %s, first token %s",
            job.id,
            reason,
            len(job.request.prompt_tokens),
            job.cached_tokens,
            f" ({lost} matched past the deepest restore point)" if lost else "",
            job.completion_tokens,
            waited,
            ttft,
        )

    def _cancel(self, job: _Job) -> None:
        if job.uid is None:
            self._waiting.remove(job)
            self._dequeued += 1
            if not self._waiting:
                self._memory_blocked = False
            self._finish(job, "cancelled", cache=None, tokens=None)
            return
        # Keep what it computed: a client that left (a timeout, Esc) usually comes back.
        removed = self._generator.remove([job.uid], return_prompt_caches=True)
        cache, tokens = removed.get(job.uid, (None, None))
        self._finish(job, "cancelled", cache, tokens)

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
        self._epoch += 1
        self.active = 0
        self._generator = self._new_generator()
        mx.clear_cache()
