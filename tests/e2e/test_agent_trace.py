"""The interleaved agent trace (bench/agent_trace.py) at a reduced size against a real server.

A bench model of the trace's kind (random weights, the default model's tokenizer) two
layers deep, the trace's shape scaled down (a ~1.4k-token main session, a sub-agent, side
calls, a second session, a restart, a compaction), and a hot tier that holds the main
session and its largest other request but not everything. Every main-session turn must
restore at least 99% of what it shares with the previous one (from RAM or disk), the turn
after the side calls all of it from RAM, the one after the restart from disk.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import agent_trace  # noqa: E402
import bench_models  # noqa: E402
from common import default_gguf, ensure_mlx_lm_folder  # noqa: E402
from trace_shape import build_trace, chatml  # noqa: E402

TINY = bench_models.Geometry(
    "trace-test",
    layers=2,
    kv_heads=2,
    head_dim=32,
    heads=2,
    hidden=64,
    intermediate=128,
    context=8192,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return bench_models.build(
        TINY, ensure_mlx_lm_folder(), default_gguf(), tmp_path_factory.mktemp("m") / "tiny"
    )


def test_every_main_turn_restores_what_it_shares_with_the_previous_one(model_dir, tmp_path) -> None:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    steps = build_trace(count, scale=0.05, tool_result_tokens=600, main_turns=12)
    tokens = {s.label: count(chatml(s.messages)) for s in steps}
    main_peak = max(tokens[s.label] for s in steps if s.session == "main")
    other_peak = max(tokens[s.label] for s in steps if s.session != "main")
    budget = (main_peak + other_peak) * TINY.kv_bytes_per_token * 11 // 10
    assert sum(tokens.values()) * TINY.kv_bytes_per_token > 2 * budget  # eviction must happen
    target = {
        "kind": "trace-test",
        "folder": model_dir,
        "gguf": model_dir / "model.gguf",
        "omlx_model": model_dir,
        "kv_bytes_per_token": TINY.kv_bytes_per_token,
    }
    ctx = {
        "workdir": tmp_path,
        "count": count,
        "n_ctx": 4096,
        "floor": False,
        # Warm restart off: this trace checks the restart's turn restored from disk (the
        # warm restart's own read back into RAM is tests/e2e/test_warm_restart.py's).
        "extra": {"omlx": ["--hot-cache-max-size", str(budget), "--no-warm-restart"]},
    }

    run = agent_trace.run_trace("omlx", 0, target, steps, ctx)

    main = [(s, r) for s, r in zip(steps, run["rows"], strict=True) if s.session == "main"]
    assert len(main) == 12 and {s.after for s, _ in main} >= {
        "cold",
        "follow-up",
        "sub-agent",
        "side calls",
        "second session",
        "restart",
        "compaction",
    }
    for step, row in main[1:]:
        assert row["shared_tokens"] > 0
        assert row["reused_share"] >= 0.99, (step.label, row)
        if step.after == "side calls":
            assert row["ssd_blocks_read"] == 0, (
                step.label,
                row,
            )  # the side calls' blocks left first
    restart = next(r for s, r in main if s.restart_before)
    assert restart["ssd_blocks_read"] > 0  # after the restart it came from disk
    assert max(r["hot_tier_bytes"] for r in run["rows"]) <= budget
