"""The composition root's per-model half: one model's engine, cache namespace and services.

``bootstrap`` builds what every model shares (the cold tier's folder, index, writer and
budget, the memory account); ``ModelLoader.load`` builds what one model needs, on the
pool's loading thread: the weights, its engine thread, its hot tier, its cold tier over
the shared parts, and the services its API endpoints call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omlx.app.cache_controls.service import CacheControls
from omlx.app.chat.observers import Observers
from omlx.app.chat.pipeline import ChatPipeline
from omlx.app.chat.service import GenerationService
from omlx.app.chat.templates import ChatRenderer
from omlx.app.models.catalog import CHAT, EMBEDDING, RERANK, ModelSpec
from omlx.app.models.chores import run_when_quiet
from omlx.app.models.options import ModelOptions
from omlx.app.models.pool import Served
from omlx.app.settings import Settings
from omlx.app.stop_signal import StopSignal
from omlx.app.wiring.warm_restart import warm_restart_for
from omlx.domain.cache.image_keys import is_image_id
from omlx.domain.cache.kv_quant import KVQuant
from omlx.domain.memory import MemoryAccount
from omlx.domain.ports import ChatModel, GenerationEngine, GrammarCompiler
from omlx.domain.startup import STARTUP

if TYPE_CHECKING:  # adapters are imported where they are built, on the loading thread
    from omlx.adapters.blockfiles import BlockWriter
    from omlx.adapters.cold_folder import ColdFolder
    from omlx.adapters.grammar import LLGuidanceCompiler
    from omlx.adapters.mlx.models.draft_model import DraftModel
    from omlx.adapters.mlx.models.loader import LoadedModel
    from omlx.adapters.mlx.models.prepared import PreparedWeights
    from omlx.domain.cache.cold_tier import ColdTier, RecencyBuffer
    from omlx.domain.cache.prefix_cache import PrefixCache
    from omlx.domain.memory import KVBudget
    from omlx.domain.speculation import SpeculationConfig

log = logging.getLogger(__name__)

# Remembers weight digests per (path, size, mtime): (path, how to compute it) -> digest.
DigestCache = Callable[[Path, Callable[[Path], str]], str]

# A GGUF's weights are dequantized to float32 on the CPU: up to ~8x its file (Q4).
_GGUF_ON_CPU_FACTOR = 8


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
        digest_cache: DigestCache | None = None,
        observers: Observers | None = None,
        stop: StopSignal | None = None,
    ) -> None:
        self.settings = settings
        self.observers = observers  # the app's metrics and request log, for every model
        self.stop = stop  # the server's stop, which ends every model's generations
        self.cold = cold
        self.account = account
        self.kv_memory_limit = kv_memory_limit
        self.digest_cache = digest_cache
        self._prepared: PreparedWeights | None = None  # built with the first GGUF load

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
        with STARTUP.step(f"{spec.id}: importing mlx-lm"):
            from omlx.adapters.mlx.models.loader import load_model
            from omlx.app.progress import for_log
        with STARTUP.step(f"{spec.id}: reading its weights and tokenizer"):
            model = load_model(
                str(spec.path) if spec.path is not None else None,
                digest_cache=self.digest_cache,
                model_id=spec.id,
                progress=lambda label, total: for_log(log, label, total, "bytes"),
                prepared=self._prepared_weights(),
            )
        with STARTUP.step(f"{spec.id}: starting its engine and cache"):
            return self.wire_chat(spec, model)

    def _prepared_weights(self) -> PreparedWeights | None:
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
        options = ModelOptions.read(model.path)  # its omlx.json, once
        kv_quant = options.kv_quant(settings.kv_quant, settings.kv_mode, gpu_backend())
        prefix_cache = cold_tier = None
        if not settings.cache_enabled:
            log.info("prefix cache of %s: off (--no-cache)", spec.id)
        elif not model.cache_supported:
            log.warning("prefix cache of %s: off: %s", spec.id, model.cache_unsupported_reason)
        else:
            prefix_cache, cold_tier = self._cache(model, closers, kv_quant)
        exact = kv_quant is not None and kv_quant.exact
        speculation, proposer, draft_weights = self._speculation(spec, model, options, exact)
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
        # Closed after the engine stopped (closers run last first): its final record
        # holds what the last requests left in RAM.
        warm = warm_restart_for(
            settings,
            prefix_cache,
            cold_tier,
            engine,
            shared=self.cold is not None and self.cold.ssd.shared,
        )
        if warm is not None:
            closers.append(warm.close)
        engine.start()
        closers.append(engine.stop)  # last added, closed first: nothing is stored after
        if warm is not None:
            warm.start()  # the prefetch: beside the first requests, never ahead of them
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
            prefix_cache=prefix_cache,
            cold_tier=cold_tier,
            observers=self.observers,
            stop=self.stop,
            kv_bytes_per_token=engine.budget.bytes_per_token if engine.budget else None,
        )
        served.closers.extend(closers)
        served.warm_restart = warm
        jobs = [lambda proceed: grammars.start_building().wait()]
        if (write := model.extra.pop("write_prepared_copy", None)) is not None:
            jobs.append(write)
        run_when_quiet(served, jobs)
        return served

    def _speculation(
        self, spec: ModelSpec, model: LoadedModel, options: ModelOptions, exact_kv: bool = False
    ) -> tuple[SpeculationConfig | None, DraftModel | None, int]:
        """How the model speculates (None: not at all), its draft model if it has one, and
        that model's weight bytes.

        Not in exact KV mode: a verify pass attends to the quantized cache with several
        queries at once, which mlx rounds differently from one query a step, and drafting
        depends on timings; on the default model a RAM hit then left the miss's greedy text
        at token 13 (tests/e2e/test_kv_exact_default_model.py), against the mode's promise.
        """
        from omlx.domain.speculation import DRAFT_MODEL, SpeculationConfig

        enabled, draft_path = options.speculation(self.settings)
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
        self, model: LoadedModel, closers: list[Callable[[], None]], kv_quant: KVQuant | None
    ) -> tuple[PrefixCache, ColdTier | None]:
        from omlx.adapters.mlx.cache.codec import MLXKVCodec
        from omlx.adapters.mlx.cache.expected_blocks import expected_blocks
        from omlx.adapters.mlx.cache.finished_caches import FinishedCaches
        from omlx.domain.cache.cold_tier import ColdTier
        from omlx.domain.cache.hot_tier import HotTier
        from omlx.domain.cache.prefix_cache import PrefixCache
        from omlx.domain.cache.probation import ProbationPolicy

        settings = self.settings
        codec = MLXKVCodec(model.layout, kv_quant)
        # What the engine writes, so a block read or imported is checked against it and
        # the index keeps it for ``omlx admin cache verify`` (one token's forward pass).
        codec.expected = expected_blocks(model.model, codec, settings.block_size)
        namespace = replace(
            model.namespace(settings.block_size, kv_quant), block_spec=codec.expected.to_json()
        )
        # One-off blocks (side calls) leave RAM before a reused conversation's (issue 20);
        # blocks read back from disk earn their place (rotating conversations, issue 38).
        hot_bytes, hot_note = self._hot_budget(model)
        hot = HotTier(hot_bytes, ProbationPolicy())
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
                check=codec.check,
                drop_missing_rows=not ssd.shared,
            )
            closers.append(cold_tier.flush)
        layout = model.layout.domain if model.layout is not None else None
        # Kept finished caches duplicate hot-tier blocks: a quarter of the guard at most.
        limit = self.kv_memory_limit
        kept = FinishedCaches(max_bytes=min(2 << 30, limit // 4) if limit else 2 << 30)
        per_token = model.kv_cost.per_token + model.kv_cost.window_per_token
        prefix_cache = PrefixCache(
            namespace=namespace,
            codec=codec,
            hot=hot,
            cold=cold_tier,
            layout=layout,
            kept=kept,
            block_bytes=per_token * settings.block_size,
            server_id=settings.server_identity,  # who computed a block, in its row
        )
        vision = model.extra.get("vision")
        if vision is not None:  # a VLM: its image rows in these tiers too (their budgets)
            from omlx.adapters.mlx.vision.rows_codec import MLXRowsCodec
            from omlx.domain.cache.image_rows import ImageRowsTiers

            vision.rows.use(ImageRowsTiers(namespace.digest, MLXRowsCodec(), hot, cold_tier))
        log.info(
            "prefix cache of %s: hot tier %s, SSD tier %s, block size %d, KV stored as %s, "
            "namespace %s",
            model.model_id,
            hot_note,
            f"{settings.paged_ssd_cache_max_size} in {self.cold.ssd.store_url}"
            if self.cold
            else "off",
            settings.block_size,
            namespace.kv_dtype,
            namespace.digest[:12],
        )
        return prefix_cache, cold_tier

    def _hot_budget(self, model: LoadedModel) -> tuple[int, str]:
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
        from omlx.app.models.encoding import EmbeddingService, RerankService

        assert spec.path is not None
        started = time.monotonic()
        if spec.task == EMBEDDING:
            model = load_embedding_model(spec.path, spec.id)
            service_type: type[EmbeddingService] | type[RerankService] = EmbeddingService
        else:
            model = load_rerank_model(spec.path, spec.id)
            service_type = RerankService
        runner = MLXRunner(spec.id).start()
        served = Served(spec, None, engine=runner, weights=weights_bytes(model.model))
        served.encoder = service_type(runner, model)
        served.closers.append(runner.stop)
        log.info("%s model %s ready in %.1f s", spec.task, spec.id, time.monotonic() - started)
        return served


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
    cold_tier: ColdTier | None = None,
    observers: Observers | None = None,
    stop: StopSignal | None = None,
    kv_bytes_per_token: int | None = None,
) -> Served:
    """A chat model's services over its started engine, wired once for the loader and for
    ``bootstrap(engine=...)`` (tests): the generation service, the cache controls and the
    chat pipeline, each complete when built. ``sampling_defaults``: the model's own (its
    generation_config.json) for what a request leaves out; ``observers``: the app's hub;
    ``stop``: the server's stop, which ends the model's generations."""
    observer = observers.for_model(spec.id) if observers is not None else None
    generation = GenerationService(
        engine,
        model,
        max_queued=settings.max_queued_requests,
        default_max_tokens=settings.default_max_tokens,
        encode=encode,
        grammars=grammars,
        sampling_defaults=sampling_defaults,
        observer=observer,
        images=getattr(model, "extra", {}).get("vision"),
        stop=stop,
    )
    tokenizer = model.tokenizer
    vision = getattr(model, "extra", {}).get("vision")
    image_digest = vision.digest_at if vision is not None else None
    controls = CacheControls(
        prefix_cache,
        partial(_decode_excerpt, tokenizer, image_digest),
        excerpts=settings.report_excerpts,
        image_digest=image_digest,
        markup=partial(_only_markup, tokenizer),
    )
    renderer = ChatRenderer(tokenizer, model.model_id)
    chat = ChatPipeline(generation, renderer, controls, observer=observer)
    return Served(
        spec,
        model,
        engine,
        weights=weights,
        generation=generation,
        chat=chat,
        controls=controls,
        prefix_cache=prefix_cache,
        cold_tier=cold_tier,
        kv_bytes_per_token=kv_bytes_per_token,
    )


def _decode_excerpt(
    tokenizer: Any, image_digest: Callable[[int], str | None] | None, tokens: Sequence[int]
) -> str:
    """A report's excerpt: the text, each image's key ids shown as one ``[image]`` (with
    the start of its SHA-256 where the server knows it: ``[image 3f2a9c1b2d4e]``)."""
    if not any(is_image_id(t) for t in tokens):
        return tokenizer.decode(list(tokens))
    out, text = [], []
    for i, t in enumerate(tokens):
        if not is_image_id(t):
            text.append(t)
        elif i == 0 or tokens[i - 1] != t - 1:  # a new run of key ids: the next image
            digest = image_digest(t) if image_digest is not None else None
            out += [tokenizer.decode(text), f"[image {digest[:12]}]" if digest else "[image]"]
            text = []
    return "".join([*out, tokenizer.decode(text)])


def _only_markup(tokenizer: Any, tokens: Sequence[int]) -> bool:
    """Whether ``tokens`` are only a template's markup: special tokens and whitespace (a
    report names a follow-up's new message past the answer's end-of-turn tokens)."""
    if any(is_image_id(t) for t in tokens):
        return False
    try:
        words = tokenizer.decode(list(tokens), skip_special_tokens=True)
    except TypeError:  # a tokenizer without the option cannot tell markup from words
        return False
    return not words.strip()


def _grammar_compiler(model: LoadedModel) -> LLGuidanceCompiler:
    """Constrained decoding for the model's tokenizer (its vocabulary view builds in the background)."""
    from omlx.adapters.grammar import LLGuidanceCompiler

    return LLGuidanceCompiler(
        model.tokenizer,
        sorted(model.tokenizer.eos_token_ids),
        model.config.get("vocab_size"),
        build_now=False,  # a chore (run_when_quiet), or the first constrained request
    )


def _guard_line(budget: KVBudget, context: int) -> str:
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
