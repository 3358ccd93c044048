"""Restored prefixes give identical output, and the reported cached tokens add up, to the token."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.finished_caches import FinishedCaches
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.partial_match import common_prefix
from omlx.domain.cache.prefix_cache import PrefixCache
from tests.engine_helpers import generate, greedy

SYSTEM = "You are a careful coding assistant. " * 12


class RecordingPrefixCache(PrefixCache):
    """Remembers every token sequence the engine stores: what a token-exact cache could reuse."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stored: list[list[int]] = []

    def begin(self, prompt: Sequence[int], **options: Any) -> Any:
        session = super().begin(prompt, **options)
        finished = session.finished

        def recording(tokens: Sequence[int] | None, cache: Any) -> None:
            if cache is not None and tokens:
                self.stored.append(list(tokens))
            finished(tokens, cache)

        session.finished = recording
        return session


def make_prefix_cache(
    model, block_size: int, hot_bytes: int = 1 << 30, keep_finished: int = 2
) -> RecordingPrefixCache:
    namespace = model.namespace(block_size)
    return RecordingPrefixCache(
        namespace=namespace,
        codec=MLXKVCodec(),
        hot=HotTier(hot_bytes),
        kept=FinishedCaches(keep_finished),
    )


def converse(model, engine, turns: list[str], max_tokens: int = 12, prompts: list | None = None):
    """A greedy multi-turn chat; returns each turn's (text, prompt length, cached tokens)."""
    messages = [{"role": "system", "content": SYSTEM}]
    results = []
    for user in turns:
        messages.append({"role": "user", "content": user})
        prompt = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        if prompts is not None:
            prompts.append(list(prompt))
        run = generate(engine, greedy(prompt, max_tokens))
        results.append((run.text, len(prompt), run.finished.cached_tokens))
        messages.append({"role": "assistant", "content": run.text})
    return results


def token_exact(prompt: list[int], stored: list[list[int]]) -> int:
    """What a token-exact prompt cache restores: the longest stored prefix, one token left."""
    return min(max((common_prefix(prompt, s) for s in stored), default=0), len(prompt) - 1)


def run_conversation(
    model,
    block_size: int | None,
    turns: list[str],
    max_tokens: int = 12,
    prompts: list | None = None,
    keep_finished: int = 2,
    engines: list | None = None,
):
    cache = (
        make_prefix_cache(model, block_size, keep_finished=keep_finished) if block_size else None
    )
    config = EngineConfig(max_concurrent=4, prefill_step_size=64)
    engine = MLXEngine(model, cache, config)
    if engines is not None:
        engines.append(engine)
    engine.start()
    try:
        return converse(model, engine, turns, max_tokens, prompts), cache
    finally:
        engine.stop()


TURNS = [
    "Read this file and tell me what it does.",
    "Now add a test for it.",
    "Thanks, and rename it.",
]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


@pytest.mark.parametrize("block_size", [16, 64])
def test_three_turns_identical_with_and_without_cache_tiny(tiny, block_size):
    plain, _ = run_conversation(tiny, None, TURNS)
    prompts: list[list[int]] = []
    cached, cache = run_conversation(tiny, block_size, TURNS, prompts=prompts)
    assert [t for t, _, _ in cached] == [t for t, _, _ in plain]
    assert cached[0][2] == 0
    for turn, ((_, prev_len, _), (_, _, cached_tokens)) in enumerate(itertools.pairwise(cached), 1):
        # The whole previous prompt and whatever of its reply re-renders to the same
        # tokens (the template closes the reply with <|im_end|>, the tiny model's reply
        # is random bytes that re-tokenize differently): to the token, blocks or not.
        assert cached_tokens >= prev_len
        assert cached_tokens == token_exact(prompts[turn], cache.stored[:turn])
    stats = cache.stats()
    assert stats.partial_hits == 2 and stats.hit_tokens == sum(c for _, _, c in cached)
    assert cache.stats().hot.bytes <= cache.stats().hot.max_bytes
    assert cache.stats().hot.pinned == 0


def test_a_next_turn_continues_the_previous_cache_in_place_to_the_same_output(tiny):
    engines: list = []
    restored, _ = run_conversation(tiny, 16, TURNS, keep_finished=0, engines=engines)
    continued, cache = run_conversation(tiny, 16, TURNS, engines=engines)
    assert continued == restored  # texts, prompt lengths and cached tokens alike
    assert engines[0].prefix_cache.stats().continued_requests == 0
    assert engines[1].prefix_cache.stats().continued_requests == len(TURNS) - 1
    assert cache.stats().hot.pinned == 0


def test_branches_continue_the_kept_cache_holding_their_prefix_to_their_own_outputs(tiny):
    def run(keep: int):
        cache = make_prefix_cache(tiny, 16, keep_finished=keep)
        engine = MLXEngine(tiny, cache, EngineConfig())
        engine.start()
        try:
            trunk = tiny.tokenizer.apply_chat_template(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURNS[0]}],
                add_generation_prompt=True,
            )
            texts = [generate(engine, greedy(trunk, 6)).text]
            for branch in (
                [5, 6, 7, 8],
                [9, 10],
                [5, 6, 7, 8],
            ):  # two branches, then the first again
                texts.append(generate(engine, greedy([*trunk, *branch], 6)).text)
            return texts, cache.stats().continued_requests
        finally:
            engine.stop()

    restored, none = run(0)
    continued, used = run(2)
    # Each branch takes the cache kept last (it holds the trunk) and keeps its own; the
    # first branch's again finds only the second's, and restores from the blocks.
    assert continued == restored and none == 0 and used == 2


def test_a_replayed_prompt_restores_all_but_its_last_token(tiny):
    cache = make_prefix_cache(tiny, 64)
    engine = MLXEngine(tiny, cache, EngineConfig())
    engine.start()
    try:
        prompt = tiny.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURNS[0]}],
            add_generation_prompt=True,
        )
        first = generate(engine, greedy(prompt, 8))
        replay = generate(engine, greedy(prompt, 8))
    finally:
        engine.stop()
    assert replay.text == first.text
    assert first.finished.cached_tokens == 0
    assert replay.finished.cached_tokens == len(prompt) - 1


def test_two_conversations_share_the_system_prompt_blocks(tiny):
    cache = make_prefix_cache(tiny, 16)
    engine = MLXEngine(tiny, cache, EngineConfig())
    engine.start()
    try:
        converse(tiny, engine, ["First conversation."])
        blocks_after_first = cache.stats().hot.blocks
        second = converse(tiny, engine, ["A different question entirely."])
    finally:
        engine.stop()
    system_tokens = len(tiny.tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}]))
    shared_blocks = system_tokens // 16
    assert second[0][2] >= shared_blocks * 16  # restored, not recomputed
    # The second conversation added only its own blocks: the shared ones exist once.
    second_prompt_blocks = second[0][1] // 16
    assert cache.stats().hot.blocks <= blocks_after_first + second_prompt_blocks - shared_blocks + 2


def test_default_model_three_turns_identical_with_and_without_cache():
    model = load_model(None)
    turns = ["What is the capital of France?", "And of Italy?", "Which is bigger?"]
    plain, _ = run_conversation(model, None, turns, max_tokens=10)
    prompts: list[list[int]] = []
    cached, cache = run_conversation(model, 64, turns, max_tokens=10, prompts=prompts)
    assert [t for t, _, _ in cached] == [t for t, _, _ in plain]
    for turn, (_, _, cached_tokens) in enumerate(cached[1:], 1):
        # A real tokenizer re-renders the reply to the tokens it generated: the whole
        # previous conversation (prompt and reply) is restored, not just its full blocks.
        previous = cache.stored[turn - 1]  # the previous prompt and completion tokens
        assert cached_tokens >= len(previous) - 1
        assert cached_tokens == token_exact(prompts[turn], cache.stored[:turn])
