"""``kv_mode = exact`` through the whole server stack (settings, model loader, engine, both
tiers): the running cache holds codes, and a hit from RAM and one from disk after a
restart give the miss's greedy output token for token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import mlx.core as mx
import pytest

from omlx.adapters.mlx.cache.quantized import QuantizedKVBlock, gpu_backend
from omlx.adapters.mlx.mlx_lm_private import batcher
from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import BatchQuantizedKVCache
from omlx.app.settings import load_settings
from omlx.app.wiring.bootstrap import bootstrap
from omlx.domain.cache.kv_quant import KVQuant
from omlx.domain.generation import GenerationRequest, SamplingParams, TextDelta
from tests.engine_helpers import generate, greedy
from tests.tiny_model import build_tiny_model

SYSTEM = "You are a careful coding assistant. " * 12
MODEL = "wide"
TOKENS = 200


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A folder with a tiny llama whose head_dim (32) a quantization group divides."""
    root = tmp_path_factory.mktemp("exact")
    build_tiny_model(root / "models" / MODEL, hidden_size=128)
    return root / "models"


def served(models: Path, cache_dir: Path, bits: int, mode: str = "exact"):
    settings = load_settings(
        env={},
        flags={
            "model_dir": str(models),
            "paged_ssd_cache_dir": str(cache_dir),
            "kv_bits": str(bits),
            "kv_group_size": 32,
            "kv_mode": mode,
            "block_size": 16,
            "warm_restart": False,  # the restart's hit comes from the block files, always
        },
    )
    container = bootstrap(settings)
    return container, asyncio.run(container.pool.acquire(MODEL))


def prompt_of(model) -> list[int]:
    return model.tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Explain it."}],
        add_generation_prompt=True,
    )


def greedy_ids(prompt: list[int], n: int) -> GenerationRequest:
    """Greedy, with each token's id handed out (``logprobs=0``) to compare runs by."""
    return GenerationRequest(tuple(prompt), n, SamplingParams(temperature=0.0), logprobs=0)


def token_ids(run) -> list[int]:
    return [e.token for ev in run.events if isinstance(ev, TextDelta) for e in ev.logprobs]


@pytest.mark.parametrize("bits", [8, 4])
def test_a_ram_hit_and_an_ssd_hit_after_a_restart_equal_the_miss(models, tmp_path, bits):
    """As the server runs: the RAM hit continues the kept finished cache (views of its
    codes), the SSD hit restores block files."""
    container, s = served(models, tmp_path / "cache", bits)
    try:
        engine, prompt = s.engine, prompt_of(s.model)
        assert engine.config.exact_kv == KVQuant(bits, 32, "exact")
        assert engine.config.speculation is None  # the server turns drafting off in exact mode
        miss = generate(engine, greedy_ids(prompt, TOKENS))
        kept = s.prefix_cache._kept  # the finished exact rows, kept for the next turn
        assert kept.nbytes > 0
        ram = generate(engine, greedy_ids(prompt, TOKENS))
        hot = s.prefix_cache._hot  # (no public accessor: the test reads RAM directly)
        blocks = [hot.get(k) for k in hot.keys()]  # noqa: SIM118 - a HotTier, not a dict
    finally:
        container.close()  # the writer drains: every block is on disk
    assert miss.finished.cached_tokens == 0
    assert miss.finished.completion_tokens == TOKENS  # 200 tokens, no early stop
    assert (ram.finished.cached_tokens, ram.finished.tier) == (len(prompt) - 1, "hot")
    assert blocks and all(isinstance(b.payload, QuantizedKVBlock) for b in blocks)
    assert len(token_ids(miss)) == TOKENS
    assert token_ids(ram) == token_ids(miss)

    container, s = served(models, tmp_path / "cache", bits)
    try:
        ssd = generate(s.engine, greedy_ids(prompt, TOKENS))
    finally:
        container.close()
    assert (ssd.finished.cached_tokens, ssd.finished.tier) == (len(prompt) - 1, "ssd")
    assert token_ids(ssd) == token_ids(miss)


def test_the_running_cache_holds_codes_and_blocks_are_sliced_from_them(models, tmp_path):
    """What decodes is a ``BatchQuantizedKVCache``; its row's codes are what RAM keeps."""
    container, s = served(models, tmp_path / "cache", 8)
    try:
        engine, prompt = s.engine, prompt_of(s.model)
        seen = []
        original = engine._step

        def step() -> None:  # look at the batch while a request decodes
            original()
            batch = batcher.generation_batch(engine._generator)
            if batch.uids and not seen:
                seen.extend(type(c) for c in batch.prompt_cache)

        engine._step = step
        run = generate(engine, greedy(prompt, 8))
        kept = s.prefix_cache._hot  # (no public accessor: the test reads RAM directly)
        first = next(iter(kept.keys()))
        block = kept.get(first).payload
    finally:
        container.close()
    assert run.finished.completion_tokens == 8
    assert seen and set(seen) == {BatchQuantizedKVCache}
    assert isinstance(block, QuantizedKVBlock) and block.quant == KVQuant(8, 32, "exact")
    # float32 KV: scales and biases stored as float16, codes as uint32 (8-bit: 4 a word).
    assert [c.dtype for c in block.keys] == [mx.uint32, mx.float16, mx.float16]
    assert block.dtype == mx.float32  # the KV's dtype, recorded in the file
    assert block.keys[0].shape[-1] == 32 * 8 // 32  # head_dim 32 at 8 bits: 8 words


def test_store_and_exact_settings_are_separate_namespaces(models, tmp_path):
    from omlx.adapters.mlx.models.loader import load_model

    model = load_model(str(models / MODEL))
    off = model.namespace(16).digest
    store = model.namespace(16, KVQuant(8, 32)).digest
    exact = model.namespace(16, KVQuant(8, 32, "exact"))
    assert len({off, store, exact.digest}) == 3
    assert exact.kv_dtype == "q8g32-exact/float32"


def test_auto_resolves_to_store_on_this_cpu(models, tmp_path):
    assert not gpu_backend()  # mlx on its CPU backend here
    container, s = served(models, tmp_path / "cache", 8, mode="auto")
    try:
        assert s.engine.config.exact_kv is None
        assert s.prefix_cache.namespace.kv_dtype == "q8g32/float32"
    finally:
        container.close()


def test_speculation_in_exact_mode_gives_the_plain_tokens(models):
    """A refused draft is trimmed from the quantized batch cache as from mlx-lm's: drafts
    partly wrong (an oracle of the plain run's tokens) leave the greedy tokens as they were."""
    from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
    from omlx.adapters.mlx.models.loader import load_model
    from omlx.domain.speculation import SpeculationConfig
    from tests.integration.test_speculation import Oracle

    model = load_model(str(models / MODEL))
    quant = KVQuant(8, 32, "exact")
    prompts = [
        model.tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True
        )
        for t in ("Tell me about the sea", "List three colours", "What is 2 + 2?")
    ]

    def runs(speculation=None, proposer=None) -> list[list[int]]:
        config = EngineConfig(prefill_step_size=32, speculation=speculation, exact_kv=quant)
        engine = MLXEngine(model, None, config, proposer=proposer)
        engine.start()
        try:
            done = [generate(engine, greedy_ids(p, 40)) for p in prompts]
        finally:
            engine.stop()
        return done

    plain = runs()
    expected = [token_ids(r) for r in plain]
    oracle = Oracle(
        [[*p, *e] for p, e in zip(prompts, expected, strict=True)], len(model.tokenizer), 3
    )
    speculated = runs(SpeculationConfig(margin=0.0), oracle)
    assert [token_ids(r) for r in speculated] == expected
    summaries = [r.finished.speculation for r in speculated]
    assert 0 < sum(s.accepted for s in summaries) < sum(s.drafted for s in summaries)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_next"])
def test_a_hit_from_ram_blocks_equals_the_miss_on_plain_and_hybrid_layouts(family, tmp_path):
    """The hit restores the hot tier's blocks (no kept finished cache here). Sliding-window
    (gemma3) and state (qwen3_next) layers run and are kept in full precision beside the
    quantized full-attention layers; a replay still equals the miss."""
    from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
    from omlx.adapters.mlx.cache.codec import MLXKVCodec
    from omlx.adapters.mlx.models.loader import load_model
    from omlx.domain.cache.hot_tier import HotTier
    from omlx.domain.cache.prefix_cache import PrefixCache
    from tests.hybrid_models import build_hybrid_model

    if family == "llama":
        folder = build_tiny_model(tmp_path / family, hidden_size=128)
    else:
        folder = build_hybrid_model(family, tmp_path / family, head_dim=32)
    model = load_model(str(folder))
    assert model.cache_supported, model.cache_unsupported_reason
    quant = KVQuant(8, 32, "exact")
    hot = HotTier(1 << 30)
    cache = PrefixCache(
        namespace=model.namespace(16, quant),
        codec=MLXKVCodec(model.layout, quant),
        hot=hot,
        layout=model.layout.domain,
    )
    engine = MLXEngine(model, cache, EngineConfig(prefill_step_size=64, exact_kv=quant))
    engine.start()
    try:
        prompt = prompt_of(model)
        miss = generate(engine, greedy_ids(prompt, 60))
        hit = generate(engine, greedy_ids(prompt, 60))
        payloads = [hot.get(k).payload for k in hot.keys()]  # noqa: SIM118 - a HotTier
    finally:
        engine.stop()
    assert engine._fresh_cache is not None  # exact mode ran
    assert hit.finished.cached_tokens > 0
    kinds = {type(g).__name__ for p in payloads for g in getattr(p, "groups", (p,))}
    assert "QuantizedKVBlock" in kinds
    if family == "gemma3_text":  # its windows: kept in full precision, as they ran
        assert "KVBlock" in kinds
    assert token_ids(hit) == token_ids(miss)
