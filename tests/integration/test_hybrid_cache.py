"""Hybrid (SSM / linear attention) and sliding-window models through the engine and the cache:
the same greedy tokens as without the cache, and follow-ups and replays restored.

The models are tiny random ones of each layout (``tests/hybrid_models.py``).
"""

from __future__ import annotations

import itertools
import random

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.prefix_cache import PrefixCache
from tests.engine_helpers import generate, greedy, submit
from tests.hybrid_models import build_hybrid_model

FAMILIES = ["qwen3_next", "gemma3_text", "falcon_h1"]
SYSTEM = "You are a careful coding assistant. " * 12
TURNS = [
    "Write a function that adds two numbers.",
    "Now make it subtract.",
    "And multiply, with tests.",
]
BLOCK = 16
STEP = 64


@pytest.fixture(scope="module", params=FAMILIES)
def hybrid(request, tmp_path_factory):
    return load_model(
        str(build_hybrid_model(request.param, tmp_path_factory.mktemp(request.param)))
    )


def prefix_cache(model) -> PrefixCache:
    return PrefixCache(
        namespace=model.namespace(BLOCK),
        codec=MLXKVCodec(model.layout),
        hot=HotTier(1 << 30),
        layout=model.layout.domain,
    )


def engine(model, cache):
    e = MLXEngine(model, cache, EngineConfig(prefill_step_size=STEP))
    e.start()
    return e


def converse(model, eng, system: str, turns: list[str]):
    messages = [{"role": "system", "content": system}]
    out = []
    for user in turns:
        messages.append({"role": "user", "content": user})
        prompt = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        run = generate(eng, greedy(prompt, 12))
        out.append((run.text, len(prompt), run.finished.cached_tokens))
        if eng.prefix_cache is not None:
            # What the report says was restored (at a restore point) is what was.
            assert run.restored.matched >= run.restored.tokens
        messages.append({"role": "assistant", "content": run.text})
    return out


def test_conversations_match_the_uncached_run_and_restore_their_prefix(hybrid):
    assert hybrid.cache_supported, hybrid.cache_unsupported_reason
    plain = engine(hybrid, None)
    try:
        want = converse(hybrid, plain, SYSTEM, TURNS)
        want_other = converse(hybrid, plain, SYSTEM, ["Explain recursion briefly."])
    finally:
        plain.stop()
    cache = prefix_cache(hybrid)
    eng = engine(hybrid, cache)
    try:
        got = converse(hybrid, eng, SYSTEM, TURNS)
        other = converse(hybrid, eng, SYSTEM, ["Explain recursion briefly."])
        replay = generate(
            eng,
            greedy(
                hybrid.tokenizer.apply_chat_template(
                    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURNS[0]}],
                    add_generation_prompt=True,
                ),
                12,
            ),
        )
    finally:
        eng.stop()
    assert [t for t, _, _ in got] == [t for t, _, _ in want]
    assert other[0][0] == want_other[0][0]
    for (_, prev_len, _), (_, _, cached) in itertools.pairwise(got):
        assert cached >= 0.9 * prev_len, (prev_len, cached)
    assert other[0][2] > 0  # the shared system prompt, to the deepest point kept in it
    assert replay.text == want[0][0]
    assert replay.finished.cached_tokens >= 0.9 * got[0][1]
    stats = cache.stats()
    assert stats.stored_objects > 0 and stats.object_bytes > 0


def test_a_window_several_windows_long_is_restored_exactly_at_every_kept_point(tmp_path):
    model = load_model(str(build_hybrid_model("gemma3_text", tmp_path / "gemma")))
    assert model.layout.domain.window == 32
    rng = random.Random(3)
    prompt = [rng.randrange(3, 300) for _ in range(300)]
    cache = prefix_cache(model)
    eng = engine(model, cache)
    try:
        generate(eng, greedy(prompt, 4))
    finally:
        eng.stop()
    # every boundary the first request kept, and the points in between it marked
    points = set()
    for length in range(2, len(prompt)):
        session = cache.begin([*prompt[:length], 7])
        hit = session.hit
        points.add(hit.cached_tokens)
        if hit.cached_tokens in (0,) or hit.cached_tokens in points - {hit.cached_tokens}:
            session.close()
            continue
        restored = session.restore()
        session.close()
        tail = ([*prompt[:length], 7])[hit.cached_tokens :]
        got = model.model(mx.array([tail]), cache=restored)[0, -1]
        fresh = make_prompt_cache(model.model)
        want = model.model(mx.array([[*prompt[:length], 7]]), cache=fresh)[0, -1]
        assert mx.argmax(got).item() == mx.argmax(want).item()
        assert mx.allclose(got, want, atol=1e-3).item(), (length, hit.cached_tokens)
    assert len(points - {0}) >= 4  # the interior points, the prompt's end and more
    assert max(points) == len(prompt) - 1


def test_nemotron_h_keeps_the_cache_off_with_its_reason(tmp_path):
    model = load_model(str(build_hybrid_model("nemotron_h", tmp_path / "nemotron")))
    assert not model.cache_supported
    assert "ssm_update without lengths" in model.cache_unsupported_reason


def test_mlx_lm_still_prefills_nemotron_h_wrongly_in_a_padded_batch(tmp_path):
    """Turns red when mlx-lm is fixed: then drop nemotron_h from BROKEN_FAMILIES."""
    from mlx_lm.generate import BatchGenerator

    model = load_model(str(build_hybrid_model("nemotron_h", tmp_path / "nemotron"))).model
    short = [5, 6, 7, 8, 9, 10]
    long = list(range(20, 60))

    def first_logprobs(prompts):
        gen = BatchGenerator(model, prefill_step_size=64)
        uids = gen.insert(prompts, max_tokens=[2] * len(prompts))
        while True:
            for r in gen.next()[1]:
                if r.uid == uids[0]:
                    return r.logprobs

    alone = first_logprobs([short])
    beside = first_logprobs([short, long])  # right-padded beside a longer prompt
    error = mx.abs(alone - beside).max().item()
    assert error > 1e-3, (
        f"mlx-lm now prefills nemotron_h right ({error}): remove it from BROKEN_FAMILIES"
    )


def test_the_layout_enters_the_namespace(tmp_path):
    qwen = load_model(str(build_hybrid_model("qwen3_next", tmp_path / "q")))
    identity = qwen.identity(BLOCK)
    assert identity["cache_layout"][0].startswith("state:2:")
    assert identity["cache_layout"][-1].startswith("mlx_lm:")
    other = dict(identity, cache_layout=["kv"] * 4)
    from omlx.domain.cache.keys import namespace_digest

    assert namespace_digest(identity) != namespace_digest(other)


def test_layouts_mlx_lm_cannot_batch_keep_the_cache_off(tmp_path):
    from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache

    # head_dim 32: the smallest group MLX quantizes
    wide = build_hybrid_model("gemma3_text", tmp_path / "g", head_dim=32, query_pre_attn_scalar=32)
    model = load_model(str(wide)).model
    from omlx.adapters.mlx.cache.layout import probe_model

    original = model.make_cache
    try:
        model.make_cache = lambda: [QuantizedKVCache(group_size=32) for _ in original()]
        assert "QuantizedKVCache layers cannot be batched" in probe_model(model).layout.unsupported
        model.make_cache = lambda: [RotatingKVCache(max_size=32, keep=4) for _ in original()]
        assert "keep > 0" in probe_model(model).layout.unsupported
    finally:
        model.make_cache = original
    assert probe_model(model).layout.unsupported == ""


class _CountingModel:
    """The model, counting its forward passes."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)


def test_one_probe_at_load_gives_the_layout_the_kv_dtype_and_the_kv_cost(hybrid):
    from omlx.adapters.mlx.cache.layout import flat_leaves, probe_model

    counting = _CountingModel(hybrid.model)
    probe = probe_model(counting)
    assert counting.calls == 1
    assert probe.layout == hybrid.layout and probe.kv_dtype == hybrid.kv_dtype
    assert probe.kv_cost == hybrid.kv_cost
    # What a real cache of n positions holds: n positions per full-attention layer, the
    # last window's per sliding-window layer, and the state arrays.
    from mlx_lm.models.cache import ArraysCache, RotatingKVCache

    from omlx.adapters.mlx.mlx_lm_private.rows import kv_slice

    n = 40
    cache = make_prompt_cache(hybrid.model)
    hybrid.model(mx.array([list(range(1, n + 1))]), cache=cache)
    mx.eval([c.state for c in flat_leaves(cache)])
    kv = window = fixed = 0
    for leaf in flat_leaves(cache):
        if isinstance(leaf, ArraysCache):
            fixed += sum(a.nbytes for a in leaf.cache if a is not None)
        elif isinstance(leaf, RotatingKVCache):
            window += sum(a.nbytes for a in kv_slice(leaf, None, n - min(n, leaf.max_size), n))
        else:
            kv += sum(a.nbytes for a in kv_slice(leaf, None, 0, n))
    cost = probe.kv_cost
    assert cost.per_token > 0 and kv == n * cost.per_token
    assert window == min(n, cost.window) * cost.window_per_token
    assert fixed == cost.fixed
    layout = probe.layout.domain
    assert (cost.window > 0) == (layout.window is not None)
    assert (cost.fixed > 0) == layout.has_state


def test_the_second_of_two_requests_on_one_prefix_reports_it_in_flight(tmp_path):
    """A hybrid does not wait for another request's prefill (its restore points are on the
    other's lattice): the second computes the shared prefix beside the first, and its
    report says the prefix was in flight, not that the cache missed."""
    model = load_model(str(build_hybrid_model("qwen3_next", tmp_path / "qwen3_next")))
    rng = random.Random(5)
    shared = [rng.randrange(3, 200) for _ in range(8 * STEP)]
    eng = engine(model, prefix_cache(model))
    try:
        runs = [submit(eng, greedy([*shared, 201 + i, 202 + i], 4)) for i in range(2)]
        assert all(r.done.wait(120) for r in runs)
    finally:
        eng.stop()
    first, second = sorted(runs, key=lambda r: r.restored.in_flight)
    assert first.restored.in_flight == 0
    assert second.restored.in_flight >= len(shared) - BLOCK - second.restored.tokens
