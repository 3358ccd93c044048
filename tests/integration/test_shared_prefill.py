"""One prefill per shared prefix in flight: two requests that start together on one long
prefix compute it once (the tiny model, a real prefix cache, the engine's thread)."""

from __future__ import annotations

import random
import time

import pytest

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.generation import PrefillProgress, PrefillStarted, TextDelta
from tests.engine_helpers import Run, generate, greedy

BLOCK, STEP = 16, 64
SHARED = 64 * BLOCK  # sixteen prefill steps


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(n)]


PREFIX = tokens(SHARED, 1)
FIRST, SECOND = PREFIX + tokens(40, 2), PREFIX + tokens(40, 3)


class Timed(Run):
    """A run that notes when it was submitted and when its first text came."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted = time.monotonic()
        self.first_text: float | None = None

    def emit(self, event) -> None:
        if isinstance(event, TextDelta) and self.first_text is None:
            self.first_text = time.monotonic()
        super().emit(event)

    @property
    def ttft(self) -> float:
        assert self.first_text is not None
        return self.first_text - self.submitted


def submit(engine: MLXEngine, prompt: list[int], max_tokens: int = 8) -> Timed:
    run = Timed()
    run.job_id = engine.submit(greedy(prompt, max_tokens), run.emit)
    return run


def engine_for(model, **config) -> MLXEngine:
    cache = PrefixCache(
        namespace=model.namespace(BLOCK), codec=MLXKVCodec(model.layout), hot=HotTier(1 << 30)
    )
    engine = MLXEngine(model, cache, EngineConfig(prefill_step_size=STEP, **config))
    engine.start()
    assert engine.wait_warm(60)
    return engine


@pytest.fixture(scope="module")
def alone(tiny) -> dict[tuple[int, ...], str]:
    """Each prompt's greedy text computed alone, with no cache at all."""
    engine = MLXEngine(tiny, None, EngineConfig(prefill_step_size=STEP))
    engine.start()
    try:
        return {tuple(p): generate(engine, greedy(p, 8)).text for p in (FIRST, SECOND)}
    finally:
        engine.stop()


def test_two_requests_on_one_prefix_compute_it_once(tiny, alone):
    engine = engine_for(tiny)
    try:
        first, second = submit(engine, FIRST), submit(engine, SECOND)
        assert first.done.wait(60) and second.done.wait(60)
    finally:
        engine.stop()
    assert first.finished.cached_tokens == 0
    assert second.finished.cached_tokens >= 0.95 * SHARED, second.finished
    assert second.ttft <= 1.2 * first.ttft, (first.ttft, second.ttft)
    # Its report is its restore after the wait (the probe before it found nothing).
    assert (second.restored.waited, second.restored.in_flight) == (True, 0)
    assert (first.restored.waited, first.restored.tokens) == (False, 0)
    assert first.text == alone[tuple(FIRST)] and second.text == alone[tuple(SECOND)]


def test_the_follower_finishes_alone_when_its_leader_is_cancelled_mid_prefill(tiny, alone):
    # With the memory guard on: the follower's first lookup (pinned for it) is let go.
    engine = engine_for(tiny, kv_memory_limit=256 << 20)
    try:
        first, second = submit(engine, FIRST, 4), submit(engine, SECOND)
        deadline = time.monotonic() + 60
        while not any(isinstance(e, PrefillProgress) and e.done >= 4 * STEP for e in first.events):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        engine.cancel(first.job_id)
        # Still waiting for the leader's blocks when the cancel was sent: not yet started.
        assert not any(isinstance(e, PrefillStarted) for e in second.events)
        assert first.done.wait(60) and second.done.wait(60)
    finally:
        engine.stop()
    reached = max(e.done for e in first.events if isinstance(e, PrefillProgress))
    assert first.finished.reason == "cancelled" and reached < SHARED
    # It restored every block the leader kept, then computed the rest itself.
    assert reached - STEP <= second.finished.cached_tokens <= reached, (reached, second.finished)
    assert second.text == alone[tuple(SECOND)]


def test_a_follower_that_shares_more_with_another_follower_waits_for_it_next(tiny):
    # Both wait for the leader's P; the second then waits for the first's Q, not computing it.
    leader = PREFIX[:512] + tokens(40, 4)
    branch = PREFIX[:512] + tokens(512, 5)
    one, two = branch + tokens(40, 6), branch + tokens(40, 7)
    engine = engine_for(tiny)
    try:
        runs = [submit(engine, p) for p in (leader, one, two)]
        assert all(r.done.wait(60) for r in runs)
    finally:
        engine.stop()
    cached = [r.finished.cached_tokens for r in runs]
    assert cached[0] == 0 and cached[1] >= 0.95 * 512 and cached[2] >= 0.95 * 1024, cached
