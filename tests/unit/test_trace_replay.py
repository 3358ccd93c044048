"""The trace replay's pure parts (bench/kvtrace.py): reading kv-cache-tester traces, tokens per
hash id, and what a perfect prefix cache would hold. The replay itself drives a server for
an hour (``make bench``) and stays out of the suite."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import kvtrace as kt

PUBLIC = Path(__file__).resolve().parents[2] / "bench" / "traces" / "kv-cache-tester"
VOCAB = kt.Vocabulary(17, 49152)


def request(t: float, n_in: int, ids: list[int], **extra) -> dict:
    return {"t": t, "type": "s", "in": n_in, "out": 10, "hash_ids": ids, **extra}


def agent(name: str, t: float, requests: list[dict]) -> dict:
    return {"type": "subagent", "agent_id": name, "subagent_type": "Explore", "t": t,
            "requests": requests}  # fmt: skip


RAW = {
    "id": "t1",
    "block_size": 4,
    "tool_tokens": 8,
    "system_tokens": 4,
    "requests": [
        request(0.0, 9, [1, 2], type="n"),
        request(5.0, 14, [1, 2, 3]),
        agent("a", 6.0, [request(0.0, 8, [10, 11]), request(2.0, 13, [10, 11, 12])]),
        agent("b", 6.5, [request(0.0, 9, [10, 11])]),
        agent("failed", 7.0, []),
        request(20.0, 17, [1, 2, 3, 4]),
    ],
}


def test_consecutive_sub_agents_are_one_group_started_together() -> None:
    trace = kt.parse_trace(RAW)
    kinds = [type(s).__name__ for s in trace.steps]
    assert kinds == ["TraceRequest", "TraceRequest", "SubAgentGroup", "TraceRequest"]
    group = trace.steps[2]
    assert [a.agent_id for a in group.agents] == ["a", "b"]  # the empty one sent nothing
    assert not trace.steps[0].streaming and trace.steps[1].streaming
    assert [r.input_tokens for r in kt.requests_in(trace.steps)] == [9, 14, 8, 13, 9, 17]
    # Sub-agents' requests on the parent's clock, in recorded order.
    assert [t for t, _ in kt.timeline(trace.steps)] == [0.0, 5.0, 6.0, 6.5, 8.0, 20.0]
    assert trace.steps[1].tail(4) == 2  # 14 tokens: three blocks of 4, and 2 in no block


def test_the_public_traces_read_and_keep_their_shape() -> None:
    traces = kt.load_traces(PUBLIC)
    assert len(traces) >= 12
    by_id = {t.id: t for t in traces}
    groups = [len(s.agents) for s in by_id["trace_0291"].steps if isinstance(s, kt.SubAgentGroup)]
    assert groups == [2]
    for trace in traces:
        assert trace.block_size == 64
        for r in kt.requests_in(trace.steps):
            assert 0 <= r.input_tokens - 64 * len(r.hash_ids) < 64  # full blocks only
    long = [t.id for t in traces if max(r.input_tokens for r in kt.parent_requests(t)) > 110_000]
    assert {"trace_0146", "trace_0404"} <= set(long)


def test_equal_hash_ids_give_equal_tokens_and_traces_do_not_share() -> None:
    scale = kt.Scale(64, 0.25)
    a = kt.Synthesizer("one", scale, VOCAB)
    b = kt.Synthesizer("two", scale, VOCAB)
    assert scale.block_tokens == 16
    assert a.block(7) == kt.Synthesizer("one", scale, VOCAB).block(7)
    assert a.block(7) != a.block(8)
    assert a.block(7) != b.block(7)  # ids are local to their trace
    assert all(VOCAB.low <= t < VOCAB.high for t in a.block(7))
    r = kt.TraceRequest(0.0, 64 * 3 + 40, 1, (1, 2, 3))
    prompt = a.prompt(r, "0")
    assert len(prompt) == scale.prompt_tokens(r) == 3 * 16 + 10
    assert prompt[:48] == [*a.block(1), *a.block(2), *a.block(3)]
    assert prompt[48:] != a.prompt(r, "1")[48:]  # each request's tail is its own


@given(st.lists(st.integers(0, 40), max_size=6), st.lists(st.integers(0, 40), max_size=6))
def test_prompts_share_exactly_the_blocks_their_ids_share(x: list[int], y: list[int]) -> None:
    synth = kt.Synthesizer("prop", kt.Scale(64, 0.125), VOCAB)
    assert len({synth.block(h)[0] for h in range(41)}) == 41  # no two blocks start alike
    shared_ids = kt.PerfectCache()
    shared_ids.add("prop", x)
    p = synth.prompt(kt.TraceRequest(0.0, 64 * len(x), 1, tuple(x)), "x")
    q = synth.prompt(kt.TraceRequest(0.0, 64 * len(y), 1, tuple(y)), "y")
    common = next((i for i, (s, t) in enumerate(zip(p, q, strict=False)) if s != t), None)
    common = min(len(p), len(q)) if common is None else common
    assert common == shared_ids.held("prop", y) * 8


def test_seeded_tokens_are_fixed_across_runs() -> None:
    # SHA-256 in counter mode, not random or hash(): a replay sends the same prompts forever.
    assert kt.seeded_tokens("t:block:1", 4, 0, 1000) == (410, 231, 33, 103)


def test_the_perfect_cache_holds_a_prefix_only_after_the_same_blocks() -> None:
    cache = kt.PerfectCache()
    assert cache.add("t", [1, 2, 3]) == 3
    assert cache.held("t", [1, 2, 3, 4]) == 3
    assert cache.held("t", [1, 2, 9, 3]) == 2
    assert cache.held("t", [2, 3]) == 0  # block 2 was seen, but after block 1
    assert cache.held("u", [1, 2]) == 0  # another trace's ids
    assert cache.add("t", [1, 2, 3, 4]) == 1


def test_the_ideal_leaves_one_token_to_prefill() -> None:
    assert kt.ideal_cached(3, 64, 200) == 192
    assert kt.ideal_cached(3, 64, 192) == 191  # the whole prompt held: the last token is computed
    assert kt.ideal_cached(0, 64, 1) == 0


def test_a_conversation_stops_before_its_first_request_past_the_context() -> None:
    trace = kt.parse_trace(RAW)
    scale = kt.Scale(4)
    # The parent stops at its 14-token request: nothing after it is sent.
    steps = kt.within_context(trace.steps, scale.prompt_tokens, 13)
    assert [r.input_tokens for r in kt.requests_in(steps)] == [9]
    steps = kt.within_context(trace.steps, scale.prompt_tokens, 16)
    assert [len(a.steps) for a in steps[2].agents] == [2, 1]
    assert len(steps) == 3  # the parent's 17-token request is past 16
    # A sub-agent is cut on its own; a group with no agent left is dropped.
    steps = kt.within_context(trace.steps, lambda r: 99 if r.input_tokens == 13 else 1, 20)
    assert [len(a.steps) for a in steps[2].agents] == [1, 1]
    steps = kt.within_context(trace.steps, lambda r: 99 if r.hash_ids[0] == 10 else 1, 20)
    assert [r.input_tokens for r in kt.requests_in(steps)] == [9, 14, 17]
    # At half scale every request fits in 8 tokens (17 -> 4 blocks of 2, a tail of 0).
    steps = kt.within_context(trace.steps, kt.Scale(4, 0.5).prompt_tokens, 8)
    assert len(list(kt.requests_in(steps))) == 6


def test_the_trace_hit_rate_counts_held_blocks_in_recorded_order() -> None:
    trace = kt.parse_trace(RAW)
    # Held blocks x 4 per request, in time order: 0, 2 (of 14), 0, 2 (b at 6.5 after a's
    # first), 2 (a's second), 3 (the parent's last) -> 36 of 70 input tokens.
    assert kt.trace_hit_rate(trace) == (0 + 8 + 0 + 8 + 8 + 12) / (9 + 14 + 8 + 9 + 13 + 17)
    assert kt.distinct_blocks([trace]) == 7


def test_accounting_against_the_ideal() -> None:
    rows = [
        {"prompt_tokens": 100, "cached_tokens": 0, "ideal": 0},
        {"prompt_tokens": 150, "cached_tokens": 90, "ideal": 99},
        {"prompt_tokens": 200, "cached_tokens": 149, "ideal": 149},
    ]
    total = kt.account(rows)
    assert total["ideal_tokens"] == 248 and total["cached_tokens"] == 239
    assert total["cached_vs_ideal"] == 239 / 248
    # 211 prefilled where a perfect cache prefills 202.
    assert total["amplification"] == 211 / 202
    assert total["requests_short"] == 1 and total["requests_over"] == 0


def test_rotation_and_restart_points() -> None:
    assert kt.round_robin([["a1", "a2", "a3"], ["b1"], ["c1", "c2"]]) == [
        (0, "a1"), (1, "b1"), (2, "c1"), (0, "a2"), (2, "c2"), (0, "a3"),
    ]  # fmt: skip
    assert kt.restart_points(10, 1) == {5}
    assert kt.restart_points(9, 2) == {3, 6}
    assert kt.restart_points(1, 1) == set()


def test_the_cache_header_is_read() -> None:
    assert kt.cache_header("cached=128; tier=ssd; diverged_at=128; message=3; role=user") == (
        128,
        "ssd",
    )
    assert kt.cache_header(None) == (None, None)
