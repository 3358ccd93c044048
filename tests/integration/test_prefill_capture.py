"""Blocks are kept as each prefill chunk completes: a cancelled request keeps what it computed.

Also pins the mlx-lm version ``mlx_lm_private`` reads private batch state of, and checks its
uncopied reads against the public, copying ``extract_cache`` path.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.generate import BatchGenerator

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.batch.fused_prefill import FusingBatchGenerator
from omlx.adapters.mlx.cache.blocks import groups_of
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.mlx_lm_private import rows, version
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import chain_keys
from omlx.domain.cache.kv_quant import KVQuant
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.generation import PrefillProgress, TextDelta
from omlx.domain.speculation import SpeculationConfig
from tests.engine_helpers import Run, generate, greedy, submit

BLOCK, STEP = 16, 64


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(n)]


def cache_for(model) -> PrefixCache:
    hot = HotTier(1 << 30)
    return PrefixCache(namespace=model.namespace(BLOCK), codec=MLXKVCodec(model.layout), hot=hot)


def test_batch_rows_was_written_for_this_mlx_lm():
    # A new mlx-lm may move the private state mlx_lm_private reads: check it, then update
    # WRITTEN_FOR.
    assert mlx_lm.__version__.startswith(version.WRITTEN_FOR)
    assert version.private_access_supported() and version.allowed()


def test_another_mlx_lm_turns_each_private_feature_off_with_one_line(tiny, monkeypatch, caplog):
    """The version check, asked at the engine's start, turns off what reads mlx-lm's private
    state and says so once per feature; the batcher, the row reads and the restored row's
    merge are then mlx-lm's public ones, and the text is the same."""
    tokens = prompt(300, seed=4)
    texts, cached = [], []
    for allowed in (True, False):
        monkeypatch.setattr(version, "allowed", lambda a=allowed: a)
        if not allowed:  # a restored row must merge through mlx-lm's copying merge
            monkeypatch.setattr(rows, "lone_row_batch", _never)
        config = EngineConfig(
            prefill_step_size=STEP,
            warm_up=False,
            in_order=True,
            speculation=SpeculationConfig(),
            exact_kv=None if allowed else KVQuant(8, 64, "exact"),
        )
        caplog.clear()
        with caplog.at_level("WARNING", logger=version.__name__):
            engine = MLXEngine(tiny, cache_for(tiny), config)
        off = [r.getMessage().split(" of ")[0] for r in caplog.records]
        engine.start()
        try:
            runs = [generate(engine, greedy(tokens, 8)) for _ in range(2)]
            texts.append([r.text for r in runs])
            cached.append(runs[1].finished.cached_tokens)
            generator = type(engine._generator)
        finally:
            engine.stop()
        if allowed:
            assert off == [] and generator is FusingBatchGenerator
        else:
            assert engine.speculation is None and generator is BatchGenerator
            assert off == [
                "speculative decoding",
                "exact KV",
                "the fused final chunk",
                "in-order decode",
                "the copy-free move to decoding",
                "uncopied block cuts",
                "the copy-free merge",
            ]
    assert texts[0] == texts[1] and texts[0][0] == texts[0][1]
    assert min(cached) >= 256  # the second turn restored its prefix: the merge ran


def _never(*_: object) -> None:
    raise AssertionError("a lone row was merged through mlx-lm's private state")


def test_a_cancel_mid_prefill_keeps_every_chunk_it_completed(tiny):
    cache = cache_for(tiny)
    engine = MLXEngine(tiny, cache, EngineConfig(prefill_step_size=STEP))
    engine.start()
    try:
        tokens = prompt(1500)
        run = submit(engine, greedy(tokens, 4))
        deadline = time.monotonic() + 60
        while not any(isinstance(e, PrefillProgress) and e.done >= 6 * STEP for e in run.events):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        engine.cancel(run.job_id)
        assert run.done.wait(30)
        while not engine.settled(run.job_id):
            time.sleep(0.01)
        reached = max(e.done for e in run.events if isinstance(e, PrefillProgress))
        assert run.finished.reason == "cancelled"
        retry = generate(engine, greedy(tokens, 4))
    finally:
        engine.stop()
    assert retry.finished.cached_tokens >= reached - STEP, (reached, retry.finished.cached_tokens)
    alone = generate_alone(tiny, tokens)
    assert retry.text == alone


def test_the_engine_stop_keeps_what_running_requests_computed(tiny):
    """The server's stop cancels what still runs as a client that left would: the prompt
    and the tokens generated so far stay in the cache (they were dropped before)."""
    cache = cache_for(tiny)
    engine = MLXEngine(tiny, cache, EngineConfig(prefill_step_size=STEP))
    engine.start()
    tokens = prompt(40)
    run = submit(engine, replace(greedy(tokens, 1500), logprobs=0))
    deadline = time.monotonic() + 60
    while sum(len(e.logprobs) for e in run.events if isinstance(e, TextDelta)) < 3 * BLOCK:
        assert time.monotonic() < deadline and not run.done.is_set()
        time.sleep(0.001)
    engine.stop()
    generated = [p.token for e in run.events if isinstance(e, TextDelta) for p in e.logprobs]
    assert run.finished.reason == "cancelled"
    held = cache.probe(tokens + generated).tokens
    # All but the last token, whose KV the next step would have computed.
    assert held >= len(tokens) + len(generated) - 2, (held, len(tokens), len(generated))


def generate_alone(model, tokens) -> str:
    engine = MLXEngine(model, None, EngineConfig(prefill_step_size=STEP))
    engine.start()
    try:
        return generate(engine, greedy(tokens, 4)).text
    finally:
        engine.stop()


def test_uncopied_reads_cut_the_same_blocks_as_extract_cache(tiny, monkeypatch):
    tokens = prompt(400, seed=1)
    stored = []
    for private in (True, False):
        monkeypatch.setattr(version, "allowed", lambda p=private: p)
        cache = cache_for(tiny)
        # Unfused in both: the fused final chunk's KV differs in the last bits (another
        # matrix shape), and this compares the two ways of reading a row, not the math.
        engine = MLXEngine(tiny, cache, EngineConfig(prefill_step_size=STEP, fuse_last_token=False))
        engine.start()
        try:
            generate(engine, greedy(tokens, 2))
        finally:
            engine.stop()
        stored.append(cache)
    keys = chain_keys(stored[0].namespace.digest, tokens, BLOCK)
    assert len(keys) == 25
    for key in keys:
        a, b = (groups_of(c.hot.get(key).payload)[0] for c in stored)
        assert mx.array_equal(a.keys, b.keys).item() and mx.array_equal(a.values, b.values).item()


def test_capture_costs_the_engine_little(tiny):
    cache = cache_for(tiny)
    engine = MLXEngine(tiny, cache, EngineConfig(prefill_step_size=STEP))
    engine.start()
    try:
        started = time.perf_counter()
        generate(engine, greedy(prompt(1200, seed=2), 2))
        elapsed = time.perf_counter() - started
    finally:
        engine.stop()
    stats = cache.stats()
    assert stats.store_calls >= 1200 // STEP  # one capture per chunk, not one at the end
    assert stats.store_seconds < 0.25 * elapsed, (stats.store_seconds, elapsed)


def test_a_fused_last_token_keeps_the_same_blocks_and_text(tiny):
    """The final short chunk run with the last token: one pass less, the same cache."""
    tokens = prompt(200, seed=2)  # three chunks of 64, then a final chunk of 8
    stored, texts, fused_rows = [], [], []
    for fuse in (True, False):
        cache = cache_for(tiny)
        engine = MLXEngine(
            tiny, cache, EngineConfig(prefill_step_size=STEP, fuse_last_token=fuse, warm_up=False)
        )  # warm-up rows would count
        engine.start()
        try:
            texts.append(generate(engine, greedy(tokens, 8)).text)
            fused_rows.append(engine._generator.fused_rows)
        finally:
            engine.stop()
        stored.append(cache)
    assert fused_rows == [1, 0]
    assert texts[0] == texts[1]
    keys = chain_keys(stored[0].namespace.digest, tokens, BLOCK)
    for key in keys:
        a, b = (groups_of(c.hot.get(key).payload)[0] for c in stored)
        assert (
            mx.allclose(a.keys, b.keys, atol=1e-4).item()
            and mx.allclose(a.values, b.values, atol=1e-4).item()
        )


def test_a_fused_final_chunk_keeps_its_blocks_before_the_request_ends(tiny):
    """Its blocks are cut after the first token (off the TTFT path), not at the end."""
    tokens = prompt(210, seed=3)  # chunks end at 64, 128, 192; the fused 18 complete block 12
    cache = cache_for(tiny)
    last_key = chain_keys(cache.namespace.digest, tokens, BLOCK)[-1]  # block [192, 208)
    seen = []

    class Watch:
        def __init__(self) -> None:
            self.run = None

        def emit(self, event) -> None:
            if isinstance(event, TextDelta):
                seen.append(cache.hot.get(last_key) is not None)
            self.run.emit(event)

    engine = MLXEngine(tiny, cache, EngineConfig(prefill_step_size=STEP, warm_up=False))
    engine.start()
    try:
        watch = Watch()
        watch.run = Run()
        watch.run.job_id = engine.submit(greedy(tokens, 32), watch.emit)
        assert watch.run.done.wait(60)
        fused = engine._generator.fused_rows
    finally:
        engine.stop()
    assert fused == 1
    assert len(seen) >= 2 and not seen[0] and any(seen[:-1]), seen
