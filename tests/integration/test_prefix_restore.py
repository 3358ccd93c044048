"""Restored prefixes give identical output, and the reported cached tokens add up."""

from __future__ import annotations

import pytest

from omlx.adapters.mlx.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.kv_codec import MLXKVCodec
from omlx.adapters.mlx.loader import load_model
from omlx.domain.blocks import NamespaceInfo
from omlx.domain.hot_tier import HotTier
from omlx.domain.keys import namespace_digest
from omlx.domain.prefix_cache import PrefixCache
from tests.engine_helpers import generate, greedy

SYSTEM = "You are a careful coding assistant. " * 12


def make_prefix_cache(model, block_size: int, hot_bytes: int = 1 << 30) -> PrefixCache:
    namespace = NamespaceInfo(
        digest=namespace_digest(model.identity(block_size)),
        model_name=model.model_id,
        model_path=str(model.path),
        block_size=block_size,
        kv_dtype=model.kv_dtype,
        layer_count=model.layer_count,
    )
    return PrefixCache(namespace=namespace, codec=MLXKVCodec(), hot=HotTier(hot_bytes))


def converse(model, engine, turns: list[str], max_tokens: int = 12):
    """A greedy multi-turn chat; returns each turn's (text, prompt length, cached tokens)."""
    messages = [{"role": "system", "content": SYSTEM}]
    results = []
    for user in turns:
        messages.append({"role": "user", "content": user})
        prompt = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        run = generate(engine, greedy(prompt, max_tokens))
        results.append((run.text, len(prompt), run.finished.cached_tokens))
        messages.append({"role": "assistant", "content": run.text})
    return results


def run_conversation(model, block_size: int | None, turns: list[str], max_tokens: int = 12):
    cache = make_prefix_cache(model, block_size) if block_size else None
    engine = MLXEngine(model, cache, EngineConfig(max_concurrent=4, prefill_step_size=64))
    engine.start()
    try:
        return converse(model, engine, turns, max_tokens), cache
    finally:
        engine.stop()


TURNS = ["Read this file and tell me what it does.", "Now add a test for it.", "Thanks, and rename it."]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


@pytest.mark.parametrize("block_size", [16, 64])
def test_three_turns_identical_with_and_without_cache_tiny(tiny, block_size):
    plain, _ = run_conversation(tiny, None, TURNS)
    cached, cache = run_conversation(tiny, block_size, TURNS)
    assert [t for t, _, _ in cached] == [t for t, _, _ in plain]
    assert cached[0][2] == 0
    for (_, prev_len, _), (_, _, cached_tokens) in zip(cached, cached[1:]):
        assert cached_tokens >= (prev_len // block_size) * block_size
        assert cached_tokens % block_size == 0
    assert cache.hot.stats().bytes <= cache.hot.stats().max_bytes


def test_two_conversations_share_the_system_prompt_blocks(tiny):
    cache = make_prefix_cache(tiny, 16)
    engine = MLXEngine(tiny, cache, EngineConfig())
    engine.start()
    try:
        converse(tiny, engine, ["First conversation."])
        blocks_after_first = cache.hot.stats().blocks
        second = converse(tiny, engine, ["A different question entirely."])
    finally:
        engine.stop()
    system_tokens = len(tiny.tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}]))
    shared_blocks = system_tokens // 16
    assert second[0][2] >= shared_blocks * 16  # restored, not recomputed
    # The second conversation added only its own blocks: the shared ones exist once.
    second_prompt_blocks = second[0][1] // 16
    assert cache.hot.stats().blocks <= blocks_after_first + second_prompt_blocks - shared_blocks + 2


def test_default_model_three_turns_identical_with_and_without_cache():
    model = load_model(None)
    turns = ["What is the capital of France?", "And of Italy?", "Which is bigger?"]
    plain, _ = run_conversation(model, None, turns, max_tokens=10)
    cached, _ = run_conversation(model, 64, turns, max_tokens=10)
    assert [t for t, _, _ in cached] == [t for t, _, _ in plain]
    for (_, prev_len, _), (_, _, cached_tokens) in zip(cached, cached[1:]):
        assert cached_tokens >= (prev_len // 64) * 64
    assert cached[2][2] > 0
