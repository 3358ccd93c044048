"""``kv_bits`` through the real engine: blocks are quantized in RAM, a hit restores them, and
its greedy output is measured against the miss (store-only: close, not bit-equal)."""

from __future__ import annotations

import pytest

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.quantized import QuantizedKVBlock
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.kv_quant import KVQuant
from omlx.domain.cache.prefix_cache import PrefixCache
from tests.engine_helpers import generate, greedy
from tests.tiny_model import build_tiny_model

SYSTEM = "You are a careful coding assistant. " * 12


@pytest.fixture(scope="module")
def wide_tiny(tmp_path_factory):
    """A tiny llama whose head_dim (32) a quantization group divides."""
    return load_model(
        str(build_tiny_model(tmp_path_factory.mktemp("wide") / "tiny", hidden_size=128))
    )


def miss_then_hit(model, quant: KVQuant | None, max_tokens: int = 200):
    hot = HotTier(1 << 30)
    # No kept finished caches: the hit must come from the (quantized) blocks.
    cache = PrefixCache(
        namespace=model.namespace(16, quant), codec=MLXKVCodec(model.layout, quant), hot=hot
    )
    engine = MLXEngine(model, cache, EngineConfig())
    engine.start()
    try:
        prompt = model.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Explain it."}],
            add_generation_prompt=True,
        )
        miss = generate(engine, greedy(prompt, max_tokens))
        hit = generate(engine, greedy(prompt, max_tokens))
    finally:
        engine.stop()
    return prompt, miss, hit, hot


def token_ids(run) -> list[str]:
    return [e.text for e in run.events if hasattr(e, "text")]


@pytest.mark.parametrize("bits", [8, 4])
def test_a_hit_restores_quantized_blocks_and_stays_close_to_the_miss(wide_tiny, bits):
    quant = KVQuant(bits, 32)
    prompt, miss, hit, hot = miss_then_hit(wide_tiny, quant)
    assert miss.finished.cached_tokens == 0
    assert hit.finished.cached_tokens == len(prompt) - 1
    blocks = [hot.get(k) for k in hot.keys()]  # noqa: SIM118 (a HotTier, not a dict)
    assert blocks and all(isinstance(b.payload, QuantizedKVBlock) for b in blocks)
    assert all(b.payload.quant == quant for b in blocks)
    # The measured agreement on this model (docs/benchmarks.md has the default model's).
    a, b = token_ids(miss), token_ids(hit)
    lead = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    print(f"kv_bits {bits}: {lead} of {len(a)} pieces equal before the first difference")
    assert lead >= (len(a) // 2 if bits == 8 else 8)


def test_ram_per_token_of_the_blocks_is_a_quarter_of_float32_at_8_bits(wide_tiny):
    plain = miss_then_hit(wide_tiny, None, max_tokens=4)[3].stats()
    eight = miss_then_hit(wide_tiny, KVQuant(8, 32), max_tokens=4)[3].stats()
    assert plain.blocks == eight.blocks > 0
    # 8-bit codes and float16 scales per 32 values: (32 + 4) / 128 of float32.
    assert eight.bytes / plain.bytes == pytest.approx(36 / 128, rel=0.01)
