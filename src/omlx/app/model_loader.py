"""The composition root's per-model half: one model's engine, cache namespace and services.

``bootstrap`` builds what every model shares (the cold tier's folder, index, writer and
budget, the memory account); ``ModelLoader.load`` builds what one model needs, on the
pool's loading thread: the weights, its engine thread, its hot tier, its cold tier over
the shared parts, and the services its API endpoints call.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omlx.app.catalog import CHAT, EMBEDDING, RERANK, ModelSpec
from omlx.app.chat import ChatPipeline
from omlx.app.pool import Served
from omlx.app.service import GenerationService
from omlx.app.settings import Settings
from omlx.app.templates import ChatRenderer
from omlx.domain.cache.kv_quant import KVQuant, model_override, resolve_kv_mode
from omlx.domain.memory import MemoryAccount
from omlx.domain.ports import ChatModel, GenerationEngine, GrammarCompiler

if TYPE_CHECKING:  # adapters are imported where they are built, on the loading thread
    from omlx.adapters.blockfiles import BlockWriter
    from omlx.adapters.cold_folder import ColdFolder
    from omlx.adapters.mlx.models.loader import LoadedModel
    from omlx.domain.cache.cold_tier import RecencyBuffer
    from omlx.domain.cache.prefix_cache import PrefixCache

log = logging.getLogger(__name__)

# A GGUF's weights are dequantized to float32 on the CPU: up to ~8x its file (Q4).
_GGUF_ON_CPU_FACTOR = 8
# A loaded model's chores (see _run_when_quiet) run after this long without a request,
# or at the latest this long after its load.
_QUIET_BEFORE_CHORES_S = 2.0
_CHORES_AT_LATEST_S = 600.0


@dataclass(slots=True)
class SharedCold:
    """The cold tier's parts every model shares: store, index, one writer, batched recency."""

    ssd: ColdFolder
    writer: BlockWriter
    recency: RecencyBuffer


class ModelLoader:
    def __init__(
        self,
        settings: Settings,
        cold: SharedCold | None,
        account: MemoryAccount,
        kv_memory_limit: int | None,
        digest_cache: Any = None,
    ) -> None:
        self.settings = settings
        self.cold = cold
        self.account = account
        self.kv_memory_limit = kv_memory_limit
        self.digest_cache = digest_cache
        self._prepared: Any = None  # PreparedWeights, built with the first GGUF load

    def estimate(self, spec: ModelSpec) -> int:
        """An upper bound of what loading ``spec`` will take, from its files."""
        import mlx.core as mx

        from omlx.adapters.mlx.models.default_model import default_model_path

        path = spec.path or default_model_path()
        if path.is_file():
            on_cpu = mx.default_device().type == mx.cpu
            return path.stat().st_size * (_GGUF_ON_CPU_FACTOR if on_cpu else 1)
        return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))

    def load(self, spec: ModelSpec) -> Served:
        if spec.task == CHAT:
            return self._chat(spec)
        if spec.task in (EMBEDDING, RERANK):
            return self._encoder(spec)
        raise ValueError(f"{spec.id}: unknown task {spec.task!r}")

    def _chat(self, spec: ModelSpec) -> Served:
        from omlx.adapters.mlx.models.loader import load_model
        from omlx.app.progress import for_log

        model = load_model(
            str(spec.path) if spec.path is not None else None,
            digest_cache=self.digest_cache,
            model_id=spec.id,
            progress=lambda label, total: for_log(log, label, total, "bytes"),
            prepared=self._prepared_weights(),
        )
        return self.wire_chat(spec, model)

    def _prepared_weights(self) -> Any:
        """Where dequantized GGUF copies are kept: in the SSD tier's folder, if it is on."""
        budget = self.settings.prepared_weights_bytes
        if self.cold is None or budget == 0:
            return None
        if self._prepared is None:
            from omlx.adapters.mlx.models.prepared import PREPARED_DIR, PreparedWeights

            self._prepared = PreparedWeights(self.settings.cache_dir / PREPARED_DIR, budget)
        return self._prepared

    def wire_chat(self, spec: ModelSpec, model: LoadedModel) -> Served:
        """A loaded chat model's cache tiers, engine thread and services."""
        from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
        from omlx.adapters.mlx.cache.quantized import gpu_backend
        from omlx.adapters.mlx.models.encoders import weights_bytes
        from omlx.adapters.mlx.models.prompt_tokens import PrefixReusingEncoder, fast_backend

        settings = self.settings
        closers: list[Callable[[], None]] = []  # the Served's, in the order they are added
        kv_quant = kv_quant_for(model.path, settings.kv_quant, settings.kv_mode, gpu_backend())
        prefix_cache = cold_tier = None
        if not settings.cache_enabled:
            log.info("prefix cache of %s: off (--no-cache)", spec.id)
        elif not model.cache_supported:
            log.warning("prefix cache of %s: off: %s", spec.id, model.cache_unsupported_reason)
        else:
            prefix_cache, cold_tier = self._cache(model, closers, kv_quant)
        exact = kv_quant is not None and kv_quant.exact
        speculation, proposer, draft_weights = self._speculation(spec, model, exact)
        engine = MLXEngine(
            model,
            prefix_cache,
            EngineConfig(
                max_concurrent=settings.max_concurrent_requests,
                prefill_step_size=settings.prefill_step_size,
                kv_memory_limit=self.kv_memory_limit,
                speculation=speculation,
                # Exact mode quantizes the running cache whether or not blocks are kept:
                # the same output with the cache on or off.
                exact_kv=kv_quant if kv_quant is not None and kv_quant.exact else None,
            ),
            account=self.account,
            proposer=proposer,
        )
        if engine.budget is not None:
            log.info(
                "memory guard of %s: %s", spec.id, _guard_line(engine.budget, model.context_length)
            )
        engine.start()
        closers.append(engine.stop)  # last added, closed first: nothing is stored after
        backend = fast_backend(model.tokenizer)
        grammars = _grammar_compiler(model)
        served = serve_chat(
            settings,
            spec,
            model,
            engine,
            weights=weights_bytes(model.model) + draft_weights,
            encode=PrefixReusingEncoder(backend, max_tokens=model.context_length).encode
            if backend is not None
            else None,
            grammars=grammars,
            sampling_defaults=model.generation_config,
        )
        served.prefix_cache, served.cold_tier = prefix_cache, cold_tier
        served.chat.prefix_cache = prefix_cache  # the turns' cache reports read it
        served.closers.extend(closers)
        jobs = [lambda proceed: grammars.start_building().wait()]
        if (write := model.extra.pop("write_prepared_copy", None)) is not None:
            jobs.append(write)
        _run_when_quiet(served, jobs)
        return served

    def _speculation(
        self, spec: ModelSpec, model: LoadedModel, exact_kv: bool = False
    ) -> tuple[Any, Any, int]:
        """How the model speculates (None: not at all), its draft model if it has one, and
        that model's weight bytes.

        Not in exact KV mode: a verify pass attends to the quantized cache with several
        queries at once, which mlx rounds differently from one query a step, and drafting
        depends on timings; on the default model a RAM hit then left the miss's greedy text
        at token 13 (tests/e2e/test_kv_exact_default_model.py), against the mode's promise.
        """
        from omlx.domain.speculation import DRAFT_MODEL, SpeculationConfig

        enabled, draft_path = speculation_for(model.path, self.settings)
        if not enabled:
            log.info("speculative decoding of %s: off", spec.id)
            return None, None, 0
        if exact_kv:
            log.info(
                "speculative decoding of %s: off: exact KV mode (a verify pass would round "
                "the quantized attention differently from a plain step)",
                spec.id,
            )
            return None, None, 0
        settings = self.settings
        layout = model.layout
        if not draft_path or layout is None or layout.unsupported or not layout.domain.plain:
            # (the engine says why a hybrid model does not speculate; no draft loaded for it)
            config = SpeculationConfig(
                max_draft=settings.speculation_max_draft, max_rows=settings.speculation_max_rows
            )
            return config, None, 0
        from omlx.adapters.mlx.models.draft_model import DraftModel, check_same_tokenizer
        from omlx.adapters.mlx.models.encoders import weights_bytes
        from omlx.adapters.mlx.models.loader import load_model

        draft = load_model(
            draft_path, digest_cache=self.digest_cache, prepared=self._prepared_weights()
        )
        check_same_tokenizer(draft.tokenizer, model.tokenizer, draft.model_id, spec.id)
        draft_bytes, served_bytes = weights_bytes(draft.model), weights_bytes(model.model)
        config = SpeculationConfig(
            method=DRAFT_MODEL,
            max_draft=settings.speculation_max_draft,
            max_rows=settings.speculation_max_rows,
            # A draft costs about a plain step of the served model times the weights' ratio.
            draft_token_cost=draft_bytes / max(served_bytes, 1),
        )
        log.info(
            "speculative decoding of %s: drafts from %s (%s)", spec.id, draft.model_id, draft_path
        )
        return config, DraftModel(draft.model, draft.model_id), draft_bytes

    def _cache(
        self, model: Any, closers: list[Callable[[], None]], kv_quant: KVQuant | None
    ) -> tuple[Any, Any]:
        from omlx.adapters.mlx.cache.codec import MLXKVCodec
        from omlx.adapters.mlx.cache.finished_caches import FinishedCaches
        from omlx.domain.cache.cold_tier import ColdTier
        from omlx.domain.cache.hot_tier import HotTier
        from omlx.domain.cache.prefix_cache import PrefixCache
        from omlx.domain.cache.reuse_eviction import ReuseLevelPolicy

        settings = self.settings
        namespace = model.namespace(settings.block_size, kv_quant)
        codec = MLXKVCodec(model.layout, kv_quant)
        # One-off blocks (side calls) leave RAM before a reused conversation's (issue 20).
        hot_bytes, hot_note = self._hot_budget(model)
        hot = HotTier(hot_bytes, ReuseLevelPolicy())
        cold_tier = None
        if self.cold is not None:
            ssd = self.cold.ssd
            ssd.index.upsert_namespace(namespace)
            cold_tier = ColdTier(
                namespace,
                ssd.store,
                ssd.index,
                self.cold.writer,
                codec.decode,
                recency=self.cold.recency,
                drop_missing_rows=not ssd.shared,
            )
            closers.append(cold_tier.flush)
        layout = model.layout.domain if model.layout is not None else None
        # Kept finished caches duplicate hot-tier blocks: a quarter of the guard at most.
        limit = self.kv_memory_limit
        kept = FinishedCaches(max_bytes=min(2 << 30, limit // 4) if limit else 2 << 30)
        prefix_cache = PrefixCache(
            namespace=namespace, codec=codec, hot=hot, cold=cold_tier, layout=layout, kept=kept
        )
        log.info(
            "prefix cache of %s: hot tier %s, SSD tier %s, block size %d, KV stored as %s, "
            "namespace %s",
            model.model_id,
            hot_note,
            f"{settings.paged_ssd_cache_max_size} in {self.cold.ssd.dir}" if self.cold else "off",
            settings.block_size,
            namespace.kv_dtype,
            namespace.digest[:12],
        )
        return prefix_cache, cold_tier

    def _hot_budget(self, model: Any) -> tuple[int, str]:
        """The model's hot tier in bytes, and in words for the log.

        ``auto``: sized from the model's KV bytes per token (full precision: quantized
        blocks fit more tokens) and the memory guard's limit (``auto_hot_tier_bytes``).
        """
        from omlx.adapters.mlx.cache.memory import auto_limit_bytes
        from omlx.domain.sizes import format_bytes
        from omlx.domain.tier_defaults import (
            HOT_TIER_AUTO_TOKENS,
            HOT_TIER_DEFAULT_BYTES,
            auto_hot_tier_bytes,
        )

        fixed = self.settings.hot_cache_bytes
        if fixed is not None:
            return fixed, self.settings.hot_cache_max_size
        per_token = model.kv_cost.per_token + model.kv_cost.window_per_token
        guard = self.kv_memory_limit if self.kv_memory_limit is not None else auto_limit_bytes()
        size = auto_hot_tier_bytes(per_token, guard)
        if size == per_token * HOT_TIER_AUTO_TOKENS:
            why = f"room for {HOT_TIER_AUTO_TOKENS:,} tokens"
        elif size == HOT_TIER_DEFAULT_BYTES:
            why = f"the {format_bytes(size)} floor"
        else:
            why = "half the KV memory limit"
        tokens = f"{size // per_token:,} tokens" if per_token else "no KV per token"
        return (
            size,
            f"auto: {format_bytes(size)} ({tokens} at {format_bytes(per_token)} each; {why})",
        )

    def _encoder(self, spec: ModelSpec) -> Served:
        from omlx.adapters.mlx.models.encoders import (
            load_embedding_model,
            load_rerank_model,
            weights_bytes,
        )
        from omlx.adapters.mlx.models.runner import MLXRunner
        from omlx.app.encoding import EmbeddingService, RerankService

        assert spec.path is not None
        started = time.monotonic()
        if spec.task == EMBEDDING:
            model = load_embedding_model(spec.path, spec.id)
            service_type: Any = EmbeddingService
        else:
            model = load_rerank_model(spec.path, spec.id)
            service_type = RerankService
        runner = MLXRunner(spec.id).start()
        served = Served(spec, None, engine=runner, weights=weights_bytes(model.model))
        served.encoder = service_type(runner, model)
        served.closers.append(runner.stop)
        log.info("%s model %s ready in %.1f s", spec.task, spec.id, time.monotonic() - started)
        return served


def kv_quant_for(
    path: Path, default: KVQuant | None, kv_mode: str | None = None, gpu: bool = False
) -> KVQuant | None:
    """The KV quantization of the model at ``path``: its folder's ``omlx.json`` over
    ``default`` and ``kv_mode`` (``auto`` resolved by ``gpu``; None: ``default``'s mode)."""
    declared_file = Path(path) / "omlx.json"
    declared: Any = {}
    if declared_file.is_file():
        try:
            declared = json.loads(declared_file.read_text())
        except ValueError as exc:  # bad JSON: name the file
            raise ValueError(f"{declared_file}: {exc}") from exc
    declared = declared if isinstance(declared, dict) else {}
    try:
        mode = declared.get("kv_mode", kv_mode)
        resolved = None if mode is None else resolve_kv_mode(mode, gpu)
        quant = model_override(declared, default, resolved)
        if quant is not None and mode is not None:  # auto also depends on the bits
            final = resolve_kv_mode(mode, gpu, quant.bits)
            if final != quant.mode:
                quant = dataclasses.replace(quant, mode=final)
        return quant
    except ValueError as exc:  # a bad kv_bits or kv_mode: name the file that set it
        raise ValueError(f"{declared_file}: {exc}" if declared else str(exc)) from exc


def speculation_for(path: Path, settings: Settings) -> tuple[bool, str]:
    """Whether the model at ``path`` speculates, and its draft model's path ("" for prompt
    lookup): its folder's ``omlx.json`` (``speculation``, ``draft_model``) over the settings."""
    enabled, draft = settings.speculation, settings.draft_model
    declared_file = Path(path) / "omlx.json"
    if not declared_file.is_file():
        return enabled, draft
    try:
        declared = json.loads(declared_file.read_text())
    except ValueError as exc:
        raise ValueError(f"{declared_file}: {exc}") from exc
    if not isinstance(declared, dict):
        return enabled, draft
    enabled = declared.get("speculation", enabled)
    draft = declared.get("draft_model", draft)
    if not isinstance(enabled, bool) or not isinstance(draft, str):
        raise ValueError(
            f'{declared_file}: "speculation" must be true or false, "draft_model" a path'
        )
    if draft and not Path(draft).is_absolute():
        draft = str(Path(path) / draft)  # a path in omlx.json is relative to its folder
    return enabled, draft


def serve_chat(
    settings: Settings,
    spec: ModelSpec,
    model: ChatModel,
    engine: GenerationEngine,
    *,
    weights: int = 0,
    encode: Callable[[str], list[int]] | None = None,
    grammars: GrammarCompiler | None = None,
    sampling_defaults: Mapping[str, Any] | None = None,
    prefix_cache: PrefixCache | None = None,
) -> Served:
    """A chat model's services over its started engine, wired once for the loader and for
    ``bootstrap(engine=...)`` (tests): the generation service and the chat pipeline.
    ``sampling_defaults``: the model's own (its generation_config.json) for what a request
    leaves out."""
    generation = GenerationService(
        engine,
        model,
        max_queued=settings.max_queued_requests,
        default_max_tokens=settings.default_max_tokens,
        encode=encode,
        grammars=grammars,
        sampling_defaults=sampling_defaults,
    )
    chat = ChatPipeline(generation, ChatRenderer(model.tokenizer, model.model_id))
    chat.prefix_cache = prefix_cache
    return Served(
        spec,
        model,
        engine,
        weights=weights,
        generation=generation,
        chat=chat,
        prefix_cache=prefix_cache,
    )


def _run_when_quiet(served: Served, jobs: list[Callable[[Callable[[], bool]], Any]]) -> None:
    """Run a loaded model's start-up chores on a thread, while it serves nothing.

    The chores hold the CPU (and the GIL) for seconds: the grammar tokenizer's build
    (0.6-0.7 s), the prepared copy's write (1.7-2.9 s for the default model; beside the
    first request it made that request's first token 1.0-1.5 s late, beside a cold turn
    that turn 1-2 s slower). Agents leave gaps between turns, and neither is needed at
    once: a constrained request builds the grammar view itself, and the copy matters at
    the next start. So they start after ``_QUIET_BEFORE_CHORES_S`` without a request, and
    each job gets ``proceed``, which it calls between its steps: it returns at once while
    the model is idle, waits for another quiet spell while it is busy, and is False once
    the model is unloaded (the job then stops; a write leaves nothing). After
    ``_CHORES_AT_LATEST_S`` it no longer waits. An unload stops the thread and waits for
    it, so the weights a write reads leave with the model.
    """
    stop = threading.Event()
    deadline = time.monotonic() + _CHORES_AT_LATEST_S

    def quiet_spell() -> bool:
        quiet_since = time.monotonic()
        while True:
            now = time.monotonic()
            if served.busy(now):
                quiet_since = now
            elif now - quiet_since >= _QUIET_BEFORE_CHORES_S or now > deadline:
                return True
            if stop.wait(0.25):
                return False  # unloaded first: a later load does the chores

    def proceed() -> bool:
        if stop.is_set():
            return False
        return not served.busy(time.monotonic()) or time.monotonic() > deadline or quiet_spell()

    def run() -> None:
        if not quiet_spell():
            return
        for job in jobs:
            if not proceed():
                return
            try:
                job(proceed)
            except Exception:  # chores are optimisations: the model serves without them
                log.warning("a start-up chore of %s failed", served.id, exc_info=True)

    thread = threading.Thread(target=run, name="omlx-chores", daemon=True)

    def stop_chores() -> None:
        stop.set()
        thread.join()

    served.closers.append(stop_chores)  # the last closer added runs first
    thread.start()


def _grammar_compiler(model: Any) -> Any:
    """Constrained decoding for the model's tokenizer (its vocabulary view builds in the background)."""
    from omlx.adapters.grammar import LLGuidanceCompiler

    return LLGuidanceCompiler(
        model.tokenizer,
        sorted(model.tokenizer.eos_token_ids),
        model.config.get("vocab_size"),
        build_now=False,  # a chore (_run_when_quiet), or the first constrained request
    )


def _guard_line(budget: Any, context: int) -> str:
    """The memory guard in words: its limit, KV per token and what one request may use,
    which the model's context caps long before the memory does on a small model."""
    from omlx.domain.sizes import format_bytes

    per_request = min(budget.token_capacity, context)
    limit = "the model's context" if per_request == context else "the memory"
    return (
        f"{format_bytes(budget.limit_bytes)} of KV memory, {format_bytes(budget.bytes_per_token)} per token: "
        f"room for {budget.token_capacity:,} tokens in all; a request may use {per_request:,} "
        f"(prompt + max_tokens, capped by {limit})"
    )
