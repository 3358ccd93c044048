"""The agent trace's shape (bench/trace_shape.py) and the bench's own arithmetic."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import itertools

from agent_trace import distinct_tokens, floor_probe
from trace_report import model_verdicts
from trace_shape import build_trace, chatml, load_shapes


def words(text: str) -> int:
    return len(text.split())


def test_the_trace_interleaves_every_kind_of_request_in_order() -> None:
    steps = build_trace(words, scale=0.05)
    sessions = [s.session for s in steps]
    assert set(sessions) == {"main", "side", "sub-agent", "second"}
    main = [s for s in steps if s.session == "main"]
    assert [s.after for s in main][:3] == ["cold", "follow-up", "follow-up"]
    afters = [s.after for s in main]
    order = [
        afters.index(a)
        for a in ("sub-agent", "side calls", "second session", "restart", "compaction")
    ]
    assert order == sorted(order)
    assert sum(s.restart_before for s in steps) == 1
    # Every main turn after the first shares a prefix with the previous main turn...
    assert all(s.shared_with_previous for s in main[1:])
    for before, after in itertools.pairwise(main):
        n = len(after.shared_with_previous)
        assert after.messages[:n] == before.messages[:n]
    # ... which after the compaction is the system prompt alone.
    compaction = next(s for s in main if s.after == "compaction")
    assert [m["role"] for m in compaction.shared_with_previous] == ["system"]


def test_sizes_follow_the_recorded_cli_requests() -> None:
    shapes = load_shapes()
    assert len(shapes["claude-code"]["tools"]) >= 10 and shapes["codex"]["tools"]
    small, large = build_trace(words, scale=0.05), build_trace(words, scale=0.2)
    size = lambda steps: words(chatml(steps[0].messages))  # noqa: E731
    assert size(large) > 3 * size(small)


def test_the_floor_probe_changes_only_the_first_new_message() -> None:
    step = [s for s in build_trace(words, scale=0.05) if s.session == "main"][3]
    probe = floor_probe(step)
    n = len(step.shared_with_previous)
    assert probe[:n] == step.messages[:n] and probe[n] != step.messages[n]
    assert probe[n + 1 :] == step.messages[n + 1 :]


def test_distinct_tokens_count_a_shared_prefix_once() -> None:
    system = {"role": "system", "content": "x " * 200}

    def ids(text: str) -> list[int]:
        return [ord(c) for c in text]  # a token per character

    one = [[system, {"role": "user", "content": "a"}]]
    both = [*one, [system, {"role": "user", "content": "b"}]]
    alone = distinct_tokens(one, ids)
    assert alone < distinct_tokens(both, ids) < 2 * alone


def test_verdicts_read_the_reuse_rule_from_the_rows() -> None:
    steps = [
        {
            "label": "main 1 (cold)",
            "session": "main",
            "after": "cold",
            "prompt_tokens": 100,
            "restart_before": False,
        },
        {
            "label": "main 2 (follow-up)",
            "session": "main",
            "after": "follow-up",
            "prompt_tokens": 120,
            "restart_before": False,
        },
    ]
    row = {"ttft": 1.0, "rss_bytes": 10, "disk_bytes": 100, "hot_tier_max_bytes": 50}
    model = {
        "model": "m",
        "steps": steps,
        "kv_bytes_per_token": 1,
        "distinct_tokens": 100,
        "weights_bytes": 10,
        "runs": [
            {"peer": "omlx", "rows": [dict(row), dict(row, reused_share=0.98, floor_ttft=1.0)]}
        ],
    }
    out = model_verdicts(model)
    assert any("1 of 1" not in v and "0 of 1" in v and "MISSED" in v for v in out), out
    model["runs"][0]["rows"][1]["reused_share"] = 1.0
    assert any("1 of 1" in v and v.endswith("MET") for v in model_verdicts(model))
