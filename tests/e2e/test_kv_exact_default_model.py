"""Exact KV mode on the real default model (SmolLM2-135M): a RAM hit and an SSD hit after a
restart give the miss's greedy output, token for token over 200 tokens, on a set of
prompts, at 8 and 4 bits. Slow: the CPU's quantized attention decodes at ~7 tokens/s."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from omlx.app.settings import load_settings
from omlx.app.wiring.bootstrap import bootstrap
from omlx.domain.generation import GenerationRequest, SamplingParams, TextDelta
from tests.engine_helpers import generate

pytestmark = pytest.mark.slow

TOKENS = 200
PROMPTS = {
    8: [
        "Explain how a write-ahead log keeps a database consistent after a crash.",
        "Write a Python function that merges two sorted lists, and explain it.",
    ],
    4: ["Describe what a prefix cache does for a chat server, step by step."],
}


def served(cache_dir: Path, bits: int):
    settings = load_settings(
        env={},
        # Warm restart off: the restart's hit must come from the block files (a prefetch
        # that won the race would make it a RAM hit).
        flags={
            "paged_ssd_cache_dir": str(cache_dir),
            "kv_bits": str(bits),
            "kv_mode": "exact",
            "warm_restart": False,
        },
    )
    container = bootstrap(settings)
    (name,) = container.pool.specs
    return container, asyncio.run(container.pool.acquire(name))


def ids_of(run) -> list[int]:
    return [e.token for ev in run.events if isinstance(ev, TextDelta) for e in ev.logprobs]


@pytest.mark.parametrize("bits", [8, 4])
def test_hits_equal_the_miss_on_the_default_model(tmp_path: Path, bits: int) -> None:
    def request(prompt: list[int]) -> GenerationRequest:
        return GenerationRequest(tuple(prompt), TOKENS, SamplingParams(temperature=0.0), logprobs=0)

    for i, text in enumerate(PROMPTS[bits]):  # a cache folder each: the first run is a miss
        cache = tmp_path / f"cache-{i}"
        container, s = served(cache, bits)
        try:
            assert s.engine.config.exact_kv is not None and s.engine.config.exact_kv.bits == bits
            assert s.engine.config.speculation is None  # on by default, off in exact mode
            prompt = s.model.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
            miss = generate(s.engine, request(prompt))
            hot = generate(s.engine, request(prompt))
        finally:
            container.close()  # the writer drains: every block is on disk
        container, s = served(cache, bits)
        try:
            disk = generate(s.engine, request(prompt))
        finally:
            container.close()
        assert miss.finished.cached_tokens == 0
        assert (hot.finished.cached_tokens, hot.finished.tier) == (len(prompt) - 1, "hot")
        assert (disk.finished.cached_tokens, disk.finished.tier) == (len(prompt) - 1, "ssd")
        assert len(ids_of(miss)) == miss.finished.completion_tokens > 0
        assert ids_of(hot) == ids_of(miss), text
        assert ids_of(disk) == ids_of(miss), text
