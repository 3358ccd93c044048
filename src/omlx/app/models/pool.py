"""The models a server serves: loaded on demand, unloaded least recently used under one limit.

Every spec of the catalog is *available*; a request for it loads it (concurrent requests
for it wait for that one load), and it stays *loaded* until the memory it needs goes to
another model, or it has been idle longer than ``idle_timeout``. The limit
(``MemoryAccount``: weights plus KV of every loaded model) is checked before a load with
an estimate from the files and after it with the real weights. A model in use (running,
queued, or asked for in the last few seconds) is never unloaded, nor is a pinned one.
Each loaded model has its own engine, services and cache namespace; the cold tier's
folder, index, writer and budget are shared, so an unloaded model's blocks stay on disk
for when it comes back.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from omlx.app.errors import AppError, Busy, InvalidRequest, ModelUnavailable, ServerStopping
from omlx.app.models.catalog import CHAT, ModelSpec
from omlx.app.models.model_names import ModelNames
from omlx.app.stop_signal import StopSignal
from omlx.domain.memory import MemoryAccount
from omlx.domain.ports import ChatModel, ModelWorker
from omlx.domain.sizes import format_bytes
from omlx.domain.startup import STARTUP

if TYPE_CHECKING:  # the services import the pool's errors; the pool only holds them
    from omlx.app.cache_controls.service import CacheControls
    from omlx.app.chat.pipeline import ChatPipeline
    from omlx.app.chat.service import GenerationService
    from omlx.app.models.encoding import EmbeddingService, RerankService
    from omlx.domain.cache.cold_tier import ColdTier
    from omlx.domain.cache.prefix_cache import PrefixCache
    from omlx.domain.cache.warm_restart import WarmRestart

log = logging.getLogger(__name__)

WARM_UP_WAIT_S = 60.0  # the longest a start-up load waits for its engine's warm-up

# A model is in use from the moment a request chooses it until that request reaches its
# engine (rendering and tokenizing come between); a request that fails before it gets
# there holds the model this long at most.
IN_USE_GRACE_S = 5.0
# How long a load waits for busy models to go idle and make room before answering 429:
# a request for another model queues behind a running one rather than failing at once.
ROOM_WAIT_S = 120.0
ROOM_POLL_S = 0.2


@dataclass(slots=True)
class Served:
    """A loaded model and what serves it: a chat model's services, or an encoder's."""

    spec: ModelSpec
    model: ChatModel | None  # chat models; an encoder's model is its service's
    engine: ModelWorker  # MLXEngine (chat) or MLXRunner (embedding, rerank)
    weights: int = 0
    kv_bytes_per_token: int | None = None  # its memory guard's count; None: no guard
    generation: GenerationService | None = None  # chat
    chat: ChatPipeline | None = None  # chat
    controls: CacheControls | None = None  # chat: what users see and steer of its cache
    encoder: EmbeddingService | RerankService | None = None
    prefix_cache: PrefixCache | None = None
    cold_tier: ColdTier | None = None
    warm_restart: WarmRestart | None = None  # its hot set recorded and read back at start
    loaded_at: float = 0.0
    load_seconds: float = 0.0
    last_used: float = 0.0
    closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def task(self) -> str:
        return self.spec.task

    def busy(self, now: float) -> bool:
        engine = self.engine
        if engine.last_submitted < self.last_used and now - self.last_used < IN_USE_GRACE_S:
            return True  # chosen by a request that has not reached the engine yet
        in_flight = self.generation.in_flight if self.generation is not None else 0
        return bool(engine.active or engine.queued or in_flight)

    def close(self) -> None:
        while self.closers:
            try:
                self.closers.pop()()
            except Exception:
                log.exception("error while unloading %s", self.id)


Loader = Callable[[ModelSpec], Served]
# What a spec's weights will take before it is loaded (an upper bound from its files).
Estimate = Callable[[ModelSpec], int]


class ModelPool:
    def __init__(
        self,
        specs: Sequence[ModelSpec],
        names: ModelNames,
        *,
        load: Loader | None = None,
        estimate: Estimate | None = None,
        account: MemoryAccount | None = None,
        pinned: Sequence[str] = (),
        idle_timeout: float | None = None,
        room_wait: float = ROOM_WAIT_S,
        release_memory: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        stop: StopSignal | None = None,
    ) -> None:
        # The server's stop: no load starts after it, nor does a request wait for one.
        self.stop = stop or StopSignal()
        self.specs = {s.id: s for s in specs}
        self.names = names
        self._load = load
        self._estimate = estimate or (lambda spec: 0)
        self.account = account or MemoryAccount(None)
        unknown = sorted(set(pinned) - set(self.specs))
        if unknown:
            raise ValueError(
                f"--pin-model {', '.join(unknown)}: no such model (served: {', '.join(self.specs)})"
            )
        self.pinned = frozenset(pinned)
        self.idle_timeout = idle_timeout
        self.room_wait = room_wait
        self._release_memory = release_memory  # after an unload: freed buffers back to the OS
        self._clock = clock
        self._loaded: dict[str, Served] = {}
        self._loading: dict[str, asyncio.Task[Served]] = {}  # one load per model at a time
        self.loads = 0
        self.load_errors: dict[str, str] = {}  # the last failed load of each model (/health)
        self.starting: set[str] = set()  # start-up loads still running (/health "ready")

    # ---- what is there --------------------------------------------------------------

    def state(self, model_id: str) -> str:
        if model_id in self._loaded:
            return "loaded"
        return "loading" if model_id in self._loading else "available"

    def context_length(self, model_id: str) -> int | None:
        """A loaded chat model's context (prompt + output tokens); None until it is loaded."""
        served = self._loaded.get(model_id)
        return served.model.context_length if served is not None and served.model else None

    def loaded(self) -> list[Served]:
        return list(self._loaded.values())

    def add(self, served: Served) -> None:
        """Hold an already loaded model (start-up, tests)."""
        served.loaded_at = served.last_used = self._clock()
        self._loaded[served.id] = served
        self.account.set_weights(served.id, served.weights)

    def is_pinned(self, key: str) -> bool:
        """Whether a running request of any loaded model holds ``key`` (the shared writer asks)."""
        return any(
            s.prefix_cache is not None and s.prefix_cache.is_pinned(key)
            for s in list(self._loaded.values())
        )

    # ---- a request's model --------------------------------------------------------------

    async def acquire(self, requested: str, task: str = CHAT) -> Served:
        """The loaded model ``requested`` names (loading it first if need be), for ``task``."""
        model_id = self.names.resolve(requested)
        spec = self.specs[model_id]
        if spec.task != task:
            raise InvalidRequest(
                f"the model {requested!r} is a {spec.task} model; this endpoint needs a {task} model",
                param="model",
                code="model_task_mismatch",
            )
        served = self._loaded.get(model_id)
        if served is None:
            served = await self._load_once(spec)
        served.last_used = self._clock()
        return served

    async def _load_once(self, spec: ModelSpec) -> Served:
        load = self._loading.get(spec.id)
        if load is None:
            self.stop.check()  # no load starts once the server is stopping
            # Its own task: a caller that leaves (or the stop refuses) never cuts a load
            # short, whose thread would go on with what it loaded and no one to close it.
            load = asyncio.ensure_future(self._load_new(spec))
            self._loading[spec.id] = load
            load.add_done_callback(lambda _: self._loading.pop(spec.id, None))
        return await self.stop.unless_stopping(asyncio.shield(load))

    async def finish_loads(self) -> None:
        """Wait for the loads under way to end (the stop), so that ``close`` unloads what they
        loaded: a loading thread still inside MLX when the interpreter exits kills it
        (``terminate called without an active exception``, or a segmentation fault)."""
        for model_id, load in list(self._loading.items()):
            log.info("stopping: waiting for the load of %s to end", model_id)
            await asyncio.wait({load})

    def check_fits(self, spec: ModelSpec) -> None:
        """Refuse now (start-up) a model that cannot fit under the limit even alone."""
        limit, need = self.account.limit_bytes, self._estimate(spec)
        if limit is not None and need > limit:
            self._make_room(spec, need)  # raises model_too_large

    async def load_at_start(self, spec: ModelSpec) -> None:
        """Load ``spec`` in the background once the server listens (a task of the app's).

        Requests for it meanwhile wait for this load; a failure is logged and kept for
        ``/health``, and the next request for the model tries again.
        """
        self.starting.add(spec.id)
        try:
            with STARTUP.step(f"loading {spec.id}"):
                served = await self._load_once(spec)
                # Ready once the warm-up has paid the first request's one-off costs (a
                # request that comes first cuts it short, so it never waits for it).
                wait_warm = getattr(served.engine, "wait_warm", None)
                if wait_warm is not None:
                    await anyio.to_thread.run_sync(wait_warm, WARM_UP_WAIT_S)
        except ServerStopping:  # the stop waits for the load itself (``finish_loads``)
            pass
        except Exception as exc:
            self.load_errors.setdefault(spec.id, str(exc))
            log.error("start-up load of %s failed: %s", spec.id, exc)
        finally:
            self.starting.discard(spec.id)

    @property
    def ready(self) -> bool:
        """No start-up load is still running."""
        return not self.starting

    def preload(self, spec: ModelSpec) -> Served:
        """Load ``spec`` now, on this thread (start-up: no event loop yet)."""
        if self._load is None:
            raise InvalidRequest(f"the model {spec.id!r} cannot be loaded here", param="model")
        self._make_room(spec, self._estimate(spec))
        started = time.monotonic()
        log.info("loading %s (%s) from %s", spec.id, spec.task, spec.label)
        served = self._load(spec)
        served.load_seconds = time.monotonic() - started
        self.loads += 1
        self.add(served)
        log.info(
            "loaded %s in %.1f s: %s of weights",
            spec.id,
            served.load_seconds,
            format_bytes(served.weights),
        )
        return served

    async def _load_new(self, spec: ModelSpec) -> Served:
        if self._load is None:
            raise InvalidRequest(f"the model {spec.id!r} cannot be loaded here", param="model")
        await self._wait_for_room(spec, self._estimate(spec))
        started = time.monotonic()
        log.info("loading %s (%s) from %s", spec.id, spec.task, spec.label)
        try:
            served = await anyio.to_thread.run_sync(self._load, spec)
        except AppError:
            raise
        except Exception as exc:
            log.exception("could not load %s from %s", spec.id, spec.label)
            self.load_errors[spec.id] = f"{type(exc).__name__}: {exc}"
            raise ModelUnavailable(
                f"the model {spec.id!r} could not be loaded from {spec.label}: {exc}",
                code="model_load_failed",
            ) from exc
        self.load_errors.pop(spec.id, None)
        served.load_seconds = time.monotonic() - started
        self.loads += 1
        self.add(served)
        log.info(
            "loaded %s in %.1f s: %s of weights; %s of the %s limit held",
            spec.id,
            served.load_seconds,
            format_bytes(served.weights),
            format_bytes(self.account.held()),
            format_bytes(self.account.limit_bytes) if self.account.limit_bytes else "unbounded",
        )
        limit = self.account.limit_bytes
        if limit is not None and self.account.held() > limit:
            try:
                self._make_room(spec, 0, beside=spec.id)
            except Exception:
                self.unload(spec.id, force=True)
                raise
        return served

    async def _wait_for_room(self, spec: ModelSpec, need: int) -> None:
        """``_make_room``, retried while loaded models are busy, up to ``room_wait`` seconds."""
        deadline = self._clock() + self.room_wait
        announced = False
        while True:
            try:
                self._make_room(spec, need)
                return
            except Busy:
                self.stop.check()
                if self._clock() >= deadline or not self._room_after_idle(need):
                    raise
                if not announced:
                    log.info("%s waits for a model in use to go idle and make room", spec.id)
                    announced = True
                await asyncio.sleep(ROOM_POLL_S)

    def _room_after_idle(self, need: int) -> bool:
        """Whether ``need`` would fit once every unpinned model went idle (else waiting is futile)."""
        limit = self.account.limit_bytes
        usage = self.account.snapshot()
        pinned = sum(v["weights"] + v["kv"] for m, v in usage.items() if m in self.pinned)
        return limit is None or pinned + need <= limit

    def _make_room(self, spec: ModelSpec, need: int, beside: str | None = None) -> None:
        """Unload idle, unpinned models (least recently used first) until ``need`` more fits."""
        limit = self.account.limit_bytes
        if limit is None:
            return
        if need > limit:
            raise InvalidRequest(
                f"the model {spec.id!r} ({spec.label}) needs about {format_bytes(need)}, more "
                f"than max_model_memory ({format_bytes(limit)}) allows alone",
                param="model",
                code="model_too_large",
            )
        now = self._clock()
        for victim in sorted(self._loaded.values(), key=lambda s: s.last_used):
            if self.account.held() + need <= limit:
                return
            if victim.id == beside or victim.id in self.pinned or victim.busy(now):
                continue
            log.info("unloading %s (least recently used) to make room for %s", victim.id, spec.id)
            self.unload(victim.id)
        if self.account.held() + need > limit:
            held = ", ".join(
                f"{m} {format_bytes(v['weights'] + v['kv'])}"
                for m, v in self.account.snapshot().items()
            )
            remedy = (
                "retry when they are idle"
                if self._room_after_idle(need)
                else "pinned models alone leave too little: unpin one (--pin-model) or raise it"
            )
            raise Busy(
                f"the model {spec.id!r} needs about {format_bytes(need)} beside what loaded models "
                f"in use or pinned hold ({held}) under max_model_memory {format_bytes(limit)}; {remedy}",
                retry_after=5,
                code="model_memory_busy",
            )

    def unload(self, model_id: str, force: bool = False) -> bool:
        """Stop serving ``model_id`` (its cold blocks stay); False when it is in use."""
        served = self._loaded.get(model_id)
        if served is None or (
            not force and (model_id in self.pinned or served.busy(self._clock()))
        ):
            return False
        del self._loaded[model_id]
        served.close()
        self.account.drop(model_id)
        del served
        gc.collect()  # the weights go now, not at the next collection
        self._release_memory()
        log.info("unloaded %s", model_id)
        return True

    async def reap_idle(self, every: float = 10.0) -> None:
        """Unload models idle for longer than ``idle_timeout`` (a background task)."""
        while True:
            await asyncio.sleep(every)
            self.unload_idle()

    def unload_idle(self) -> list[str]:
        if self.idle_timeout is None:
            return []
        now = self._clock()
        idle = [
            s.id
            for s in list(self._loaded.values())
            if s.id not in self.pinned and now - s.last_used > self.idle_timeout and not s.busy(now)
        ]
        return [m for m in idle if self.unload(m)]

    def close(self) -> None:
        for model_id in list(self._loaded):
            self.unload(model_id, force=True)
