"""When to draft and how much (domain/speculation.py), what prompt lookup proposes, and
speculative sampling's distribution."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from omlx.adapters.mlx.batch.prompt_lookup import PromptLookup, continuation
from omlx.adapters.mlx.batch.sampling import CategoricalSampler
from omlx.adapters.mlx.batch.speculative import accept_sampled
from omlx.domain.speculation import (
    Acceptance,
    DraftPolicy,
    SpeculationConfig,
    StepCosts,
    expected_tokens,
)


def test_expected_tokens_per_step():
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 8) == 9.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.9, 12) == pytest.approx((1 - 0.9**13) / 0.1)


def test_free_text_is_not_drafted_and_copied_text_is_drafted_long():
    policy = DraftPolicy.of(SpeculationConfig())
    assert policy.length(0.05, 12) == 0  # free text: a longer pass would not pay
    assert policy.length(0.2, 12) == 0
    copying = policy.length(0.95, 12)
    assert copying >= 8
    assert policy.length(0.95, 3) == 3  # at most what was offered
    assert policy.length(0.7, 12) < copying


def test_a_costlier_step_drafts_less():
    cheap, dear = DraftPolicy.of(SpeculationConfig()), DraftPolicy.of(SpeculationConfig())
    dear.costs.slope = 0.5
    assert 0 < dear.length(0.85, 12) < cheap.length(0.85, 12)
    assert dear.length(0.5, 12) == 0


def test_step_costs_follow_measurements_but_stay_bounded():
    costs = StepCosts()
    costs.observe(4, 1.0)  # no plain step seen yet: nothing to compare with
    assert costs.slope == 0.15
    costs.observe_plain(0.1)
    for _ in range(60):
        costs.observe(8, 0.1 * (1 + 8 * 0.05))  # each drafted token costs 5% of a step
    assert costs.slope == pytest.approx(0.05, abs=0.005)
    for _ in range(200):
        costs.observe(1, 50.0)  # a neighbour's burst: clamped, drafting can come back
    assert costs.slope <= 0.6


def test_acceptance_believes_recent_steps():
    a = Acceptance()
    assert a.rate == 0.5
    for _ in range(6):
        a.record(8, 8)
    assert a.rate > 0.9
    for _ in range(10):  # the copy ended: ten first drafts refused
        a.record(1, 0)
    assert a.rate < 0.5


def test_config_is_checked():
    with pytest.raises(ValueError, match="method"):
        SpeculationConfig(method="magic")
    with pytest.raises(ValueError):
        SpeculationConfig(max_draft=0)
    with pytest.raises(ValueError):
        SpeculationConfig(ngram_min=3, ngram_max=2)


def test_continuation_takes_the_latest_longest_match():
    ctx = np.array([5, 6, 7, 8, 9, 1, 6, 7, 3, 4, 2, 6, 7], dtype=np.int32)
    # "6 7" occurred twice before: the latest one (followed by 3 4 2) wins.
    assert continuation(ctx, 4, 2, 3).tolist() == [3, 4, 2]
    # A longer n-gram is preferred: "1 6 7" occurred once, followed by 3.
    ctx2 = np.array([1, 6, 7, 3, 9, 6, 7, 8, 1, 6, 7], dtype=np.int32)
    assert continuation(ctx2, 3, 2, 2).tolist() == [3, 9]
    assert continuation(np.array([1, 2, 3, 4], dtype=np.int32), 3, 2, 4).size == 0
    assert continuation(np.array([1, 2, 1, 2], dtype=np.int32), 4, 2, 8).tolist() == [1, 2]


def test_prompt_lookup_follows_a_growing_row():
    lookup = PromptLookup(3, 2)
    tokens = [10, 11, 12, 13, 14, 20, 21]
    seen = []
    assert lookup.propose(1, tokens, 10, 4, lambda n: seen.append(n) or n) == []
    tokens.append(10)
    assert lookup.propose(1, tokens, 11, 4, lambda n: seen.append(n) or n) == [12, 13, 14, 20]
    assert lookup.propose(1, tokens, 11, 4, lambda n: 2) == [12, 13]
    assert seen == [4]  # asked only when something was on offer
    big = [*range(3000), 5, 6]
    assert lookup.propose(2, big, 7, 3, lambda n: n) == [8, 9, 10]  # the buffer grows
    big += [7, 8, 9, 10, 11]
    assert lookup.propose(2, big, 12, 2, lambda n: n) == [13, 14]
    lookup.forget(1)


def test_speculative_sampling_keeps_the_distribution():
    """Drafts accepted with p(d), else a token drawn from p without d: the first token is
    distributed as p_0, the second (after an accepted first draft) as p_1."""
    vocab = 6
    p0 = np.array([0.05, 0.4, 0.1, 0.3, 0.1, 0.05])
    p1 = np.array([0.2, 0.1, 0.1, 0.2, 0.3, 0.1])
    logprobs = mx.log(mx.array(np.stack([p0, p1, p1])))
    sampler = CategoricalSampler(1.0, seed=1234)
    firsts = np.zeros(vocab)
    seconds = np.zeros(vocab)
    draft = [3, 4]
    trials = 6000
    for _ in range(trials):
        accepted, token = accept_sampled(sampler, logprobs, draft)
        produced = [*draft[:accepted], token]
        firsts[produced[0]] += 1
        if accepted >= 1:
            seconds[produced[1]] += 1
    assert np.abs(firsts / trials - p0).sum() < 0.05
    assert np.abs(seconds / seconds.sum() - p1).sum() < 0.08
