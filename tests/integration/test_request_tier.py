"""The engine reports where each request's cached prefix came from (the dashboard's tier column)."""

from __future__ import annotations

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.prefix_cache import PrefixCache
from tests.engine_helpers import generate, greedy
from tests.fakes import FakeColdSource

SYSTEM = "You are a careful coding assistant. " * 12


def run(model, cold: FakeColdSource, prompts: list[list[int]]) -> list[tuple[int, str]]:
    """Each prompt through a fresh engine and hot tier over ``cold``: (cached tokens, tier)."""
    codec = MLXKVCodec(model.layout)  # as the model loader wires it
    layout = model.layout.domain if model.layout is not None else None
    cache = PrefixCache(
        namespace=model.namespace(16), codec=codec, hot=HotTier(1 << 30), cold=cold, layout=layout
    )
    engine = MLXEngine(model, cache, EngineConfig())
    engine.start()
    try:
        out = []
        for prompt in prompts:
            finished = generate(engine, greedy(prompt, 4)).finished
            out.append((finished.cached_tokens, finished.tier))
        return out
    finally:
        engine.stop()


def test_a_request_s_tier_is_none_then_hot_then_ssd_after_ram_is_gone(tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    prompt = model.tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}],
        add_generation_prompt=True,
    )
    cold = FakeColdSource(decode=MLXKVCodec(model.layout).decode)
    (miss, hot) = run(model, cold, [prompt, prompt])
    assert miss == (0, "none")
    assert hot[0] > 0 and hot[1] == "hot"
    # A new process's empty RAM: the same prompt's blocks come from the disk tier.
    ((cached, tier),) = run(model, cold, [prompt])
    assert cached > 0 and tier == "ssd"
