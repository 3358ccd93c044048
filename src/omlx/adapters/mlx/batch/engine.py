"""The generation engine: one thread owns MLX and runs mlx-lm's continuous batcher.

Requests arrive through a thread-safe inbox; events leave through each
request's ``emit`` callback (the app bridges them to its event loop). Restored
prefixes enter the batch as ready caches, so only the uncached tail is prefilled.

Scheduling: first come, first served into a batch of at most ``max_concurrent``.
Each ``BatchGenerator.next()`` runs one decode step for the running streams and
then one chunk (``prefill_step_size`` tokens per prompt) of the prompts being
prefilled, so streams keep producing tokens while a long prompt is prefilled; a
short prompt that joins a long one's prefill batch moves to decoding as soon as
its own tokens are done. A memory guard (``domain.memory.KVBudget``) admits a request
only when its KV fits beside the running ones, shrinking the hot tier first. A request
whose prefix a running request is prefilling waits for it, out of the batch, and restores
what it kept (``followers``, ``domain.shared_prefill``).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from omlx.adapters.mlx.batch import admission, jobs
from omlx.adapters.mlx.batch.config import EngineConfig, exact_caches, features_for, new_generator
from omlx.adapters.mlx.batch.followers import Followers
from omlx.adapters.mlx.batch.jobs import Emit, Job, log_finished
from omlx.adapters.mlx.batch.processors import grammar_finish_reason, request_processors
from omlx.adapters.mlx.batch.row_plans import PlannedRows
from omlx.adapters.mlx.batch.sampling import SharedSamplers
from omlx.adapters.mlx.batch.speculation import Proposer, Speculation
from omlx.adapters.mlx.batch.warm_up import warm_up
from omlx.adapters.mlx.mlx_lm_private import rows
from omlx.adapters.mlx.models.loader import LoadedModel
from omlx.domain.generation import (
    Failed,
    GenerationRequest,
    PrefillProgress,
    PrefillStarted,
    SamplingParams,
    StopStringMatcher,
)
from omlx.domain.memory import KVBudget, MemoryAccount
from omlx.domain.scheduler import Scheduler, Verdict
from omlx.domain.startup import STARTUP

if TYPE_CHECKING:
    from omlx.domain.cache.blocks import CachedPrefix
    from omlx.domain.cache.prefix_cache import PrefixCache

log = logging.getLogger(__name__)
_REQUEST_IDS = itertools.count(1)  # shared by every model's engine: numbers are process-wide

_GREEDY = SamplingParams()


class MLXEngine:
    """Owns the model, the batcher and the prefix cache; everything MLX runs on its thread."""

    def __init__(
        self,
        model: LoadedModel,
        prefix_cache: PrefixCache | None,
        config: EngineConfig | None = None,
        account: MemoryAccount | None = None,
        proposer: Proposer | None = None,
    ) -> None:
        self.model = model
        self.prefix_cache = prefix_cache
        self.config = config or EngineConfig()
        # Asked once: what it runs with, and whether it may use mlx-lm's private state.
        self._features = features_for(model, self.config, proposer, prefix_cache is not None)
        self._speculation = self._features.speculation
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._ids = _REQUEST_IDS  # one numbering for the process: log lines stay unique
        self._running: dict[int, Job] = {}  # batcher uid -> job
        self._jobs: dict[int, Job] = {}  # job id -> job (waiting or running)
        self._stopping = threading.Event()
        self._warmed = threading.Event()  # the warm-up ran, or a request cut it short
        self._thread: threading.Thread | None = None
        self._generator: BatchGenerator | None = None
        self._eos = sorted(model.tokenizer.eos_token_ids)
        # One object shared by every request: the batcher builds a matcher per row.
        self._stop_tokens = StopSequences([[t] for t in self._eos])
        self._samplers = SharedSamplers()
        # Measured at load, by the model's one probe (``cache.layout.probe_model``).
        limit = self.config.kv_memory_limit
        cost = model.kv_cost if limit is not None else None
        budget = KVBudget(limit, cost.per_token, cost) if cost is not None else None
        self.scheduler = Scheduler(self.config.max_concurrent, budget, account, model.model_id)
        # Admitted, waiting for a running request's prefill of their prefix (not in the batch).
        self._followers = Followers(prefix_cache, self.config.prefill_step_size)
        self._steps = 0  # batcher steps taken (how long a follower has waited)
        self.last_step_at = time.monotonic()
        self.last_submitted = 0.0  # time.monotonic() of the latest submit (the pool reads it)
        self._buffers_held = False  # MLX holds freed buffers worth releasing when idle
        # A fresh request's cache, in exact mode (set on the engine thread); None: mlx-lm's.
        self._fresh_cache: Callable[[], list[Any]] | None = None
        self._idle_tasks: list[
            tuple[Callable[[], None], Future[bool]]
        ] = []  # ``when_idle``'s, run after the drain
        # An M-RoPE model's rows, each told its request's position plan (``row_plans``).
        needs_plans = getattr(model.model, "needs_row_plans", False)
        self._plans = PlannedRows(model.model) if needs_plans else None

    @property
    def budget(self) -> KVBudget | None:
        return self.scheduler.budget

    @property
    def queued(self) -> int:
        """Requests waiting for a batch slot (read by the app for 429s, /health, metrics)."""
        return self.scheduler.queued

    @property
    def active(self) -> int:
        """Requests in the running batch."""
        return self.scheduler.active

    @property
    def kv_token_capacity(self) -> int | None:
        """The most positions (prompt + max_tokens) one request may use; None: no guard."""
        return self.scheduler.kv_token_capacity

    # ---- any thread -------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="omlx-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # inside one long step: it ends with the process
                log.warning("the engine of %s did not stop in %.0f s", self.model.model_id, timeout)
        while True:  # idle tasks it never read: dropped
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "idle" and not arg[1].done():
                arg[1].set_result(False)

    def submit(self, request: GenerationRequest, emit: Emit) -> int:
        """Queue a request; returns its id for ``cancel``."""
        job_id = next(self._ids)
        self.scheduler.note_submitted()
        self.last_submitted = now = time.monotonic()
        self._inbox.put(("submit", Job(job_id, request, emit, now)))
        return job_id

    def settled(self, job_id: int) -> bool:
        """Whether the engine is wholly done with a job, its blocks stored (for tests and tools)."""
        return job_id not in self._jobs

    def wait_warm(self, timeout: float) -> bool:
        """Wait until the warm-up is over (done, or cut short by a request); False on timeout."""
        return self._warmed.wait(timeout)

    def cancel(self, job_id: int) -> None:
        self._inbox.put(("cancel", job_id))

    def when_idle(self, task: Callable[[], None]) -> Future[bool]:
        """Run ``task`` once on the engine thread if it is idle when the task's turn comes:
        no request running, waiting or in the inbox. Otherwise it is dropped: a request
        that arrives first always goes first. One that arrives while it runs waits for it.
        The future: True once it ran, False when dropped (or the engine stopped)."""
        done: Future[bool] = Future()
        self._inbox.put(("idle", (task, done)))
        return done

    # ---- engine thread ----------------------------------------------------

    def _run(self) -> None:
        self._fresh_cache = exact_caches(self.model, self._features.exact_kv)
        self._generator = self._new_generator()
        if self.config.warm_up:
            with STARTUP.step(f"warming up {self.model.model_id}"):
                self._warm_up()
        self._warmed.set()
        while not self._stopping.is_set():
            busy = bool(self._running) or bool(self._followers)
            idle = not busy and not self.scheduler.has_waiting
            if idle:
                self._release_buffers_if_idle()
                self._write_deferred()
            self._drain_inbox(block=idle)
            if self._idle_tasks:
                self._run_idle_tasks()
            for job in self._followers.ready(self._running.values(), self._steps):
                admission.look_again(job)
                self._start(job)
            self._admit_waiting()
            if not self._running:
                continue
            try:
                self._step()
            except Exception as exc:  # a failed step must not kill the server
                log.exception("engine step failed")
                self._fail_all(f"generation failed: {exc}")
        # Stopping: the cancels sent before the stop first, then whatever still runs, each
        # keeping what it computed as for a client that left (the server's stop).
        self._drain_inbox(block=False)
        for job in list(self._jobs.values()):
            if not job.done:
                self._cancel_at_stop(job)
        self._write_deferred()  # the stop's writer waits for room: RAM is about to go
        for _, done in self._idle_tasks:
            done.set_result(False)

    def _warm_up(self) -> None:
        """One tiny generation before the first request (``warm_up.warm_up``)."""
        started = time.monotonic()
        try:
            token = self._eos[0] if self._eos else 0
            interrupted = warm_up(
                self._generator,
                self.model.model,
                token,
                self._samplers.of(_GREEDY),
                request_waiting=lambda: not self._inbox.empty(),
                new_cache=self._fresh_cache,
            )
        except Exception:  # a model the warm-up cannot drive still serves requests
            log.warning(
                "warm-up of %s failed; the first request pays its costs",
                self.model.model_id,
                exc_info=True,
            )
            self._generator = self._new_generator()
            return
        how = "warmed up"
        if interrupted:
            cause = "the server's stop" if self._stopping.is_set() else "a request"
            how = f"warm-up stopped for {cause}:"
        log.info("%s %s in %.2f s", how, self.model.model_id, time.monotonic() - started)

    @property
    def speculation(self) -> Speculation | None:
        return self._speculation

    def _new_generator(self) -> BatchGenerator:
        generator = new_generator(self.model, self.config, self._features, self._plans)
        if self._plans is not None:
            self._plans.clear()
            self._plans.generator = generator
        return generator

    def _drain_inbox(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = command
            if kind == "submit":
                self._jobs[arg.id] = arg
                self.scheduler.enqueue(arg)
            elif kind == "cancel":
                job = self._jobs.get(arg)
                if job is not None and not job.done:
                    self._cancel(job)
            elif kind == "idle":
                self._idle_tasks.append(arg)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run_idle_tasks(self) -> None:
        """``when_idle``'s tasks, each only while no request runs, waits or has arrived."""
        tasks, self._idle_tasks = self._idle_tasks, []
        for task, done in tasks:
            if (
                self._running
                or self._followers
                or self.scheduler.has_waiting
                or not self._inbox.empty()
            ):
                log.debug("engine busy: an idle task is dropped")
                done.set_result(False)
                continue
            try:
                task()
            except Exception:
                log.exception("an idle task failed")
            done.set_result(True)
            # What it made (a kept cache) is as fresh as a finished request's.
            self.last_step_at = time.monotonic()
            self._buffers_held = True
            self._report_memory()

    def _admit_waiting(self) -> None:
        """Start what the scheduler lets leave the queue (FCFS, within the KV memory)."""
        for job, verdict in self.scheduler.admissible(
            partial(admission.make_room, self.prefix_cache) if self.prefix_cache else None
        ):
            if verdict is Verdict.REFUSE:
                self._refuse(job)
                continue
            self.scheduler.started(job)  # its slot and memory are its own, waiting or not
            if self._followers.hold(job, self._running.values(), self._steps):
                self._report_memory()
                continue
            self._start(job)

    def _start(self, job: Job) -> None:
        """An admitted request joins the batch (or fails, its slot given back)."""
        try:
            self._admit(job)
        except Exception as exc:
            log.exception("could not admit request %d", job.id)
            self._release(job)
            self._jobs.pop(job.id, None)
            self.scheduler.ended(job.id)
            job.emit(Failed(f"could not start generation: {exc}"))
        self._report_memory()

    def _report_memory(self) -> None:
        """What this model's KV holds now, for the process-wide account (several models)."""
        account = self.scheduler.account
        if account is not None:
            held = self.prefix_cache.held_bytes() if self.prefix_cache is not None else 0
            account.set_kv(self.model.model_id, self.scheduler.reserved_bytes() + held)

    def _refuse(self, job: Job) -> None:
        message = self.scheduler.refusal(
            job, len(job.request.prompt_tokens), job.request.max_tokens
        )
        self._release(job)
        self._jobs.pop(job.id, None)
        job.emit(Failed(message))

    def _admit(self, job: Job) -> None:
        tokens = list(job.request.prompt_tokens)
        cache = admission.starting_cache(self.prefix_cache, job, self._fresh_cache)
        job.times["admitted"] = time.monotonic()
        plan = job.session.plan if job.session is not None else ()
        block_size = self.prefix_cache.block_size if self.prefix_cache is not None else None
        step = self.config.prefill_step_size
        positions = self._plans.plan(tokens) if self._plans is not None else None
        (job.uid,) = self._generator.insert_segments(
            [admission.segments(tokens, job.cached_tokens, plan, block_size, step)],
            max_tokens=[job.request.max_tokens],
            caches=[cache],
            all_tokens=[tokens[: job.cached_tokens]],
            samplers=[self._samplers.of(job.request.sampling)],
            logits_processors=[request_processors(job.request, self._eos)],
            stop_sequences=[self._stop_tokens],
        )
        if self._plans is not None:
            self._plans.track(job.uid, positions)
        if self._speculation is not None:
            self._speculation.enable(job.uid)
        job.kept = job.prefilled = job.cached_tokens
        job.detok = self.model.tokenizer.detokenizer
        job.stops = StopStringMatcher(job.request.stop)
        job.times["inserted"] = time.monotonic()
        self._running[job.uid] = job
        job.emit(PrefillStarted(job.cached_tokens, len(tokens), self._restored(job)))

    def _restored(self, job: Job) -> CachedPrefix | None:
        """What ``job``'s restore used, for its report: its lookup, and whether a running
        request was computing more of its prefix (or had, while it waited for it)."""
        if job.session is None:
            return None
        in_flight = self._followers.in_flight(job, self._running.values())
        return replace(job.session.restored(), in_flight=in_flight, waited="held" in job.times)

    def _step(self) -> None:
        prompt_responses, generation_responses = self._generator.next()
        self.last_step_at = time.monotonic()
        self._steps += 1
        for r in prompt_responses:
            job = self._running.get(r.uid)
            if job is not None and r.end_of_prompt:
                job.times.setdefault("prefilled", self.last_step_at)
                if getattr(r, "fused", False):
                    # Its final chunk ran with the last token: the row already decodes.
                    done, total = r.progress
                    job.prefilled = done + job.cached_tokens
                    job.emit(PrefillProgress(job.prefilled, total + job.cached_tokens))
                    if job.session is not None:
                        job.deferred_capture = job.prefilled
            elif job is not None:
                done, total = r.progress
                job.prefilled = done + job.cached_tokens
                job.emit(PrefillProgress(job.prefilled, total + job.cached_tokens))
                if r.end_of_segment and job.session is not None:
                    job.session.prefilled(
                        self._view(rows.prefill_row, job), job.cached_tokens + done
                    )
                    job.kept = job.cached_tokens + done
        for r in generation_responses:
            job = self._running.get(r.uid)
            if job is None or job.done:
                continue
            self._on_token(job, r)
            if job.deferred_capture is not None and not job.done and job.session is not None:
                position, job.deferred_capture = job.deferred_capture, None
                job.session.prefilled(self._view(rows.decode_row, job), position)
                job.kept = position

    def _view(self, row_of: Callable[..., Any], job: Job) -> Callable[[], Any]:
        """What gives a running request's cache as it is now, when the session asks for it."""
        return partial(row_of, self._generator, job.uid, self._features.private)

    def _on_token(self, job: Job, r: Any) -> None:
        if "first_token" not in job.times:
            job.times["first_token"] = time.monotonic()
        job.fed_tokens += 1
        if r.finish_reason is None and job.session is not None:
            position = len(job.request.prompt_tokens) + job.fed_tokens
            if job.session.wants_decoded(position):
                job.session.decoded(self._view(rows.decode_row, job), position)
        if r.finish_reason != "stop":  # not EOS
            jobs.hand_out(job, r.token, r.logprobs)
        if job.stops.stopped:
            if job.logprobs:
                jobs.emit_text(job, "")
            removed = self._generator.remove([job.uid], return_prompt_caches=True)
            cache, tokens = removed.get(job.uid, (None, None))
            # A speculative step may have fed tokens past this one: keep what was handed out.
            cache, tokens = _cut(cache, tokens, len(job.request.prompt_tokens) + job.fed_tokens)
            self._finish(job, "stop", cache, tokens)
        elif r.finish_reason is not None:
            jobs.flush(job)
            reason = (
                "stop" if job.stops.stopped else grammar_finish_reason(job.request, r.finish_reason)
            )
            self._finish(job, reason, r.prompt_cache, r.all_tokens)

    def _finish(self, job: Job, reason: str, cache: Any, tokens: list[int] | None) -> None:
        """Drop its KV, tell the client, then unpin its prefix and store its new blocks.

        The client hears first: cutting blocks waits for the batch's in-flight decode
        step, time no response should wait for. The job stays listed (``settled`` is
        False) until its blocks are stored, and the next command is read only after.
        """
        job.done = True
        if job.uid is not None:
            self._running.pop(job.uid, None)
            if self._plans is not None:
                self._plans.forget(job.uid)
        self.scheduler.ended(job.id)
        self._report_memory()
        speculated = self._speculation.pop(job.uid) if self._speculation is not None else None
        job.emit(jobs.finished_event(job, reason, speculated))
        log_finished(job, reason, self.model.model_id, speculated)
        if job.session is not None:
            job.session.finished(tokens, cache)  # never raises
        self._jobs.pop(job.id, None)
        if job.session is not None and cache is not None:
            self._report_memory()  # a finished cache may be kept for the next turn
        self._buffers_held = True

    def _write_deferred(self) -> None:
        """Blocks a full write queue kept back go to disk while the engine has nothing else
        to do (``keeper``: a restart would lose them); never raises."""
        if self.prefix_cache is None:
            return
        try:
            self.prefix_cache.write_deferred()
        except Exception:
            log.exception("queueing deferred blocks for disk failed")

    def _release_buffers_if_idle(self) -> None:
        """Idle past ``release_buffers_after_s``: MLX's buffer pool goes back. The kept
        finished caches stay (an agent's tool may run longer than that before its next
        turn): like the hot tier they are KV the memory guard counts and asks back."""
        if (
            self._buffers_held
            and time.monotonic() - self.last_step_at > self.config.release_buffers_after_s
        ):
            mx.clear_cache()
            self._buffers_held = False
            self._report_memory()

    def _cancel(self, job: Job) -> None:
        if job.uid is None:
            if not self._followers.withdraw(job):
                self.scheduler.withdraw(job)
            self._finish(job, "cancelled", cache=None, tokens=None)
            return
        # Keep what it computed: a client that left (a timeout, Esc) usually comes back.
        removed = self._generator.remove([job.uid], return_prompt_caches=True)
        cache, tokens = removed.get(job.uid, (None, None))
        self._finish(job, "cancelled", cache, tokens)

    def _cancel_at_stop(self, job: Job) -> None:
        try:
            self._cancel(job)
        except Exception:  # a batch a failed step left unusable: its rows' caches are lost
            log.exception("request %d: its cache could not be kept at the stop", job.id)
            if not job.done:
                self._finish(job, "cancelled", cache=None, tokens=None)

    def _release(self, job: Job) -> None:
        """Unpin its prefix: it leaves without a cache to keep (refused, failed)."""
        if job.session is not None:
            job.session.close()

    def _fail_all(self, message: str) -> None:
        for job in list(self._running.values()):
            self._release(job)
            self._jobs.pop(job.id, None)
            job.emit(Failed(message))
        self._running.clear()
        self.scheduler.clear()
        for job in self._followers:  # waiting out of the batch: not failed, still admitted
            self.scheduler.started(job)
        if self._speculation is not None:
            self._speculation.clear()
        if self.prefix_cache is not None:
            self.prefix_cache.drop_kept()
        self._generator = self._new_generator()
        mx.clear_cache()


def _cut(cache: Any, tokens: list[int] | None, length: int) -> tuple[Any, list[int] | None]:
    """A removed row's cache and tokens cut to its first ``length`` positions."""
    if cache is None or tokens is None or len(tokens) <= length:
        return cache, tokens
    extra = len(tokens) - length
    for layer in cache:
        layer.trim(extra)
    return cache, tokens[:length]
