"""The engine under concurrency: chunked prefill, the memory guard, and pins released at once."""

from __future__ import annotations

import threading
import time

import pytest

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.batch.sampling import SharedSamplers
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.finished_caches import FinishedCaches
from omlx.adapters.mlx.cache.memory import CACHE_STEP, KVBudget
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.generation import (
    Failed,
    Finished,
    PrefillProgress,
    PrefillStarted,
    SamplingParams,
    TextDelta,
)
from tests.engine_helpers import Run, generate, greedy


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def make_prefix_cache(model, block_size: int, hot_bytes: int = 1 << 30) -> PrefixCache:
    namespace = model.namespace(block_size)
    return PrefixCache(namespace=namespace, codec=MLXKVCodec(), hot=HotTier(hot_bytes))


def chat(model, text: str) -> list[int]:
    return model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )


class Timeline:
    """Every event of several requests in the one order the engine thread emitted them."""

    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []
        self.runs: dict[str, Run] = {}

    def run(self, name: str) -> Run:
        run = Run()
        inner = run.emit

        def emit(event) -> None:
            self.log.append((name, event))
            inner(event)

        run.emit = emit  # type: ignore[method-assign]
        self.runs[name] = run
        return run

    def index(self, name: str, kind: type, last: bool = False) -> int:
        hits = [i for i, (n, e) in enumerate(self.log) if n == name and isinstance(e, kind)]
        assert hits, f"{name} emitted no {kind.__name__}"
        return hits[-1] if last else hits[0]


def start(tiny, prefix_cache=None, **config) -> MLXEngine:
    engine = MLXEngine(tiny, prefix_cache, EngineConfig(**config))
    engine.start()
    return engine


# ---- chunked prefill ---------------------------------------------------------------


def test_short_request_during_a_long_prefill_gets_its_first_token_first(tiny):
    engine = start(tiny, max_concurrent=4, prefill_step_size=32)
    try:
        long_prompt = chat(
            tiny, "Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 120
        )
        short_prompt = chat(tiny, "Hello there")
        assert len(long_prompt) > 20 * 32  # a prefill of many chunks
        solo_long = generate(engine, greedy(long_prompt, 8)).text
        solo_short = generate(engine, greedy(short_prompt, 8)).text

        timeline = Timeline()
        long_run, short_run = timeline.run("long"), timeline.run("short")
        submitted = threading.Event()

        def long_emit(event, inner=long_run.emit) -> None:
            inner(event)
            # Submitted from the engine thread itself: deterministically mid-prefill.
            if isinstance(event, PrefillProgress) and not submitted.is_set():
                submitted.set()
                engine.submit(greedy(short_prompt, 8), short_run.emit)

        long_run.emit = long_emit  # type: ignore[method-assign]
        engine.submit(greedy(long_prompt, 8), long_run.emit)
        assert long_run.done.wait(120) and short_run.done.wait(120)

        short_first = timeline.index("short", TextDelta)
        long_last_chunk = timeline.index("long", PrefillProgress, last=True)
        long_first = timeline.index("long", TextDelta)
        assert short_first < long_last_chunk < long_first
        # Its chunks were padded beside the long prompt's; the text is unchanged by it.
        assert short_run.text == solo_short
        assert long_run.text == solo_long
    finally:
        engine.stop()


class Token:
    """A marker the counting engine emits for every decoded token (text may lag tokens)."""


class CountingEngine(MLXEngine):
    def _on_token(self, job, r) -> None:
        job.emit(Token())
        super()._on_token(job, r)


def test_running_streams_keep_decoding_while_a_long_prompt_prefills(tiny):
    engine = CountingEngine(tiny, None, EngineConfig(max_concurrent=4, prefill_step_size=32))
    engine.start()
    try:
        timeline = Timeline()
        stream = timeline.run("stream")
        stream_id = engine.submit(greedy(chat(tiny, "Go on"), 400), stream.emit)
        while not any(isinstance(e, TextDelta) for e in stream.events):
            stream.done.wait(0.01)
        prefill = timeline.run("prefill")
        engine.submit(greedy(chat(tiny, "Read: " + "lorem ipsum dolor " * 150), 4), prefill.emit)
        assert prefill.done.wait(120)
        engine.cancel(stream_id)
        assert stream.done.wait(30)
        started = timeline.index("prefill", PrefillStarted)
        ended = timeline.index("prefill", TextDelta)
        tokens_during = sum(
            1 for n, e in timeline.log[started:ended] if n == "stream" and isinstance(e, Token)
        )
        chunks = sum(
            1
            for n, e in timeline.log[started:ended]
            if n == "prefill" and isinstance(e, PrefillProgress)
        )
        assert chunks > 10
        assert tokens_during >= chunks - 2  # about one decode step per prefill chunk
    finally:
        engine.stop()


# ---- memory guard ------------------------------------------------------------------


def test_memory_guard_refuses_a_request_that_never_fits(tiny):
    probe = start(tiny, kv_memory_limit=1 << 20)
    bpt = probe.budget.bytes_per_token
    probe.stop()
    engine = start(tiny, kv_memory_limit=bpt * 2 * CACHE_STEP)  # 512 positions in all
    try:
        assert engine.kv_token_capacity == 2 * CACHE_STEP
        run = generate(engine, greedy(chat(tiny, "Hi"), 1000))
        assert isinstance(run.events[-1], Failed)
        message = run.events[-1].message
        assert "kv_memory_limit" in message and "max_tokens" in message and "512" in message
        assert engine.queued == 0 and engine.active == 0
        assert generate(engine, greedy(chat(tiny, "Hi"), 100)).finished.reason == "length"
    finally:
        engine.stop()


def test_memory_guard_queues_what_fits_only_alone(tiny):
    bpt = 2 * 2 * 2 * 16 * 4  # the tiny model: layers x (k, v) x kv_heads x head_dim x float32
    prompt_a, prompt_b = chat(tiny, "First in line"), chat(tiny, "Second in line")
    # Each fits alone (512 positions), two side by side (2 x 512) do not.
    engine = start(tiny, max_concurrent=4, kv_memory_limit=bpt * 3 * CACHE_STEP)
    try:
        assert engine.budget.bytes_per_token == bpt
        solo_b = generate(engine, greedy(prompt_b, 300)).text
        timeline = Timeline()
        a, b = timeline.run("a"), timeline.run("b")
        engine.submit(greedy(prompt_a, 400), a.emit)
        engine.submit(greedy(prompt_b, 300), b.emit)
        assert a.done.wait(120) and b.done.wait(120)
        assert timeline.index("b", PrefillStarted) > timeline.index("a", Finished)
        assert b.finished.reason == "length" and b.text == solo_b
    finally:
        engine.stop()
    # The same pair with room for both runs side by side.
    engine = start(tiny, max_concurrent=4, kv_memory_limit=bpt * 4 * CACHE_STEP)
    try:
        timeline = Timeline()
        a, b = timeline.run("a"), timeline.run("b")
        engine.submit(greedy(prompt_a, 400), a.emit)
        engine.submit(greedy(prompt_b, 300), b.emit)
        assert a.done.wait(120) and b.done.wait(120)
        assert timeline.index("b", PrefillStarted) < timeline.index("a", Finished)
    finally:
        engine.stop()


def test_hot_tier_gives_memory_back_before_a_request_waits(tiny):
    cache = make_prefix_cache(tiny, 16)
    filler = start(tiny, cache)
    try:
        for i in range(4):
            generate(filler, greedy(chat(tiny, f"Fill the cache, part {i}. " + "words " * 60), 40))
    finally:
        filler.stop()
    hot_before = cache.stats().hot.bytes
    assert hot_before > 64 * 1024
    bpt = 512
    pair = KVBudget(1 << 40, bpt).batch_bytes([400 + 30, 100 + 30])  # two rows of 512 positions
    limit = pair + hot_before // 2  # the pair fits only if the hot tier gives half back
    engine = start(tiny, cache, max_concurrent=4, kv_memory_limit=limit)
    try:
        timeline = Timeline()
        a, b = timeline.run("a"), timeline.run("b")
        engine.submit(greedy(chat(tiny, "Brand new question one"), 400), a.emit)
        engine.submit(greedy(chat(tiny, "Brand new question two"), 100), b.emit)
        assert a.done.wait(120) and b.done.wait(120)
        assert timeline.index("b", PrefillStarted) < timeline.index("a", Finished)
        stats = cache.stats().hot
        assert stats.evictions > 0
        assert stats.bytes < hot_before
    finally:
        engine.stop()


def test_memory_guard_leaves_a_next_turn_the_kept_cache_it_continues(tiny):
    cache = PrefixCache(
        namespace=tiny.namespace(16),
        codec=MLXKVCodec(),
        hot=HotTier(1 << 30),
        kept=FinishedCaches(),
    )
    messages = [{"role": "user", "content": "Read this file and say what it does. " * 6}]
    first = tiny.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    engine = start(tiny, cache, release_buffers_after_s=0.05)
    try:
        reply = generate(engine, greedy(first, 12)).text
        deadline = time.monotonic() + 30
        while engine._buffers_held:  # idle: MLX's buffer pool goes back, the kept cache stays
            assert time.monotonic() < deadline, "the idle engine kept its buffers"
            time.sleep(0.01)
    finally:
        engine.stop()
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Thanks."}]
    second = tiny.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    held, kept = cache.held_bytes(), cache.stats().kept_bytes
    assert kept > 0
    bpt = 2 * 2 * 2 * 16 * 4  # the tiny model's KV bytes per position (float32)
    need = KVBudget(1 << 40, bpt).batch_bytes([len(second) + 12])
    # Room for the second turn and the hot tier, not for a copy of the kept cache besides:
    # counted twice (as before), the kept cache would be dropped and the prefix assembled.
    limit = need + (held - kept) + kept // 2
    engine = start(tiny, cache, kv_memory_limit=limit)
    try:
        run = generate(engine, greedy(second, 12))
    finally:
        engine.stop()
    assert run.finished.cached_tokens >= len(first)
    assert cache.stats().continued_requests == 1  # it continued the kept cache in place
    assert cache.stats().hot.pinned == 0


# ---- releasing -------------------------------------------------------------------


def test_cancel_and_finish_release_pins_at_once(tiny):
    cache = make_prefix_cache(tiny, 16)
    engine = start(tiny, cache, max_concurrent=4, kv_memory_limit=1 << 24)
    try:
        prompt = chat(tiny, "A shared prefix that is long enough for blocks. " * 4)
        generate(engine, greedy(prompt, 4))
        assert cache.stats().active_leases == 0

        run = Run()
        job_id = engine.submit(greedy(prompt, 1500), run.emit)
        while not any(isinstance(e, TextDelta) for e in run.events):
            run.done.wait(0.01)
        assert cache.stats().active_leases == 1 and cache.stats().hot.pinned > 0
        engine.cancel(job_id)
        assert run.done.wait(30) and run.finished.reason == "cancelled"
        assert run.finished.cached_tokens > 0
        assert cache.stats().active_leases == 0 and cache.stats().hot.pinned == 0
        assert engine.active == 0 and engine.queued == 0

        finished = generate(engine, greedy(prompt, 4))
        assert finished.finished.cached_tokens > 0
        assert cache.stats().active_leases == 0 and cache.stats().hot.pinned == 0
    finally:
        engine.stop()


def test_cancel_while_waiting_in_the_queue(tiny):
    engine = start(tiny, max_concurrent=1)
    try:
        running, waiting = Run(), Run()
        running_id = engine.submit(greedy(chat(tiny, "Keep going"), 1500), running.emit)
        while not running.events:
            running.done.wait(0.01)
        waiting_id = engine.submit(greedy(chat(tiny, "Me next"), 10), waiting.emit)
        waiting.done.wait(0.2)
        assert engine.queued == 1 and not waiting.events  # behind the running one
        engine.cancel(waiting_id)
        assert waiting.done.wait(30) and waiting.finished.reason == "cancelled"
        assert engine.queued == 0 and engine.active == 1
        engine.cancel(running_id)
        assert running.done.wait(30)
        assert engine.active == 0
    finally:
        engine.stop()


def test_unseeded_samplers_are_shared_so_the_batch_samples_at_once():
    samplers = SharedSamplers()  # the engine's
    warm = SamplingParams(temperature=0.7, top_p=0.9)
    assert samplers.of(warm) is samplers.of(SamplingParams(temperature=0.7, top_p=0.9))
    assert samplers.of(SamplingParams()) is samplers.of(SamplingParams(top_p=0.5))  # greedy
    seeded = SamplingParams(temperature=0.7, seed=1)
    assert samplers.of(seeded) is not samplers.of(seeded)  # each owns its PRNG key


# ---- the guard's arithmetic and its setting ----------------------------------------


def test_budget_reserves_rectangular_batches_in_cache_steps():
    budget = KVBudget(limit_bytes=10 * CACHE_STEP * 100, bytes_per_token=100)
    assert budget.positions(1) == CACHE_STEP and budget.positions(257) == 2 * CACHE_STEP
    # Three rows as long as the longest (300 -> 512 positions), whatever the others' lengths.
    assert budget.batch_bytes([10, 300, 20]) == 3 * 2 * CACHE_STEP * 100
    assert budget.batch_bytes([]) == 0
    assert budget.token_capacity == 10 * CACHE_STEP
    assert budget.fits_alone(10 * CACHE_STEP) and not budget.fits_alone(10 * CACHE_STEP + 1)


def test_kv_memory_limit_setting():
    from omlx.app.settings import load_settings
    from omlx.app.wiring.bootstrap import _kv_memory_limit

    assert _kv_memory_limit(load_settings(env={}, flags={"kv_memory_limit": "off"})) is None
    assert _kv_memory_limit(load_settings(env={}, flags={"kv_memory_limit": "2GB"})) == 2 * 10**9
    auto = _kv_memory_limit(load_settings(env={}))
    assert auto is not None and auto > 0
    assert _kv_memory_limit(load_settings(env={"OMLX_KV_MEMORY_LIMIT": "512MiB"})) == 512 * 2**20
    with pytest.raises(ValueError, match="kv_memory_limit"):
        load_settings(env={}, flags={"kv_memory_limit": "0"})
    with pytest.raises(ValueError, match="bad size"):
        load_settings(env={}, flags={"kv_memory_limit": "lots"})
