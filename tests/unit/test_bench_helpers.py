"""The benchmarks' pure helpers: medians and spreads, run order, JSON output, plots, verdicts.

The benches themselves run servers for minutes (``make bench``) and stay out of the suite.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import agent_loop
import index_scale
import plots
import summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_summarize_gives_median_and_spread_and_skips_missing_values() -> None:
    s = summary.summarize([3.0, None, 1.0, math.nan, 2.0, 10.0])
    assert s == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4, "values": [3.0, 1.0, 2.0, 10.0]}
    assert summary.summarize([]) is None
    assert summary.summarize([None, math.nan]) is None


def test_ratio_of_medians_and_of_plain_numbers() -> None:
    a, b = summary.summarize([1.0, 2.0, 3.0]), summary.summarize([4.0])
    assert summary.ratio(a, b) == 0.5
    assert summary.ratio(3.0, 2.0) == 1.5
    assert summary.ratio(a, None) is None
    assert summary.ratio(None, b) is None
    assert summary.ratio(a, 0.0) is None


def test_fmt_spread_shows_min_max_only_for_several_values() -> None:
    assert summary.fmt_spread(summary.summarize([0.5])) == "0.500 s"
    assert summary.fmt_spread(summary.summarize([0.5, 0.25, 1.0])) == "0.500 s (0.250-1.000)"
    assert summary.fmt_spread(summary.summarize([7.25, 8.0]), "tok/s", 1) == "7.6 tok/s (7.2-8.0)"
    assert summary.fmt_spread(None) == "-"
    assert summary.fmt_x(0.8) == "0.80x"
    assert summary.fmt_x(None) == "-"


def test_interleaved_alternates_direction_every_round() -> None:
    order = summary.interleaved(["a", "b", "c"], 3)
    assert [p for _, p in order] == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert summary.interleaved(["a"], 0) == []


def test_write_json_adds_name_and_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_OUT", str(tmp_path / "out"))
    path = summary.write_json("demo", {"x": 1.5, "where": tmp_path})
    assert path == tmp_path / "out" / "demo.json"
    data = json.loads(path.read_text())
    assert data["bench"] == "demo" and data["x"] == 1.5 and data["where"] == str(tmp_path)
    assert isinstance(data["git_sha"], str) and data["git_sha"]
    assert summary.out_path("demo", ".png") == tmp_path / "out" / "demo.png"


def test_plots_write_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    s = summary.summarize
    bars = plots.grouped_bars(
        tmp_path / "bars.png",
        "title",
        "seconds",
        ["cold", "follow-up"],
        {"omlx": [s([1.0, 2.0]), s([0.3])], "llama.cpp": [None, s([0.4, 0.5])]},
        log=True,
        note="a note",
    )
    lines = plots.line_panels(
        tmp_path / "lines.png",
        "title",
        [
            {
                "x": [10, 100],
                "series": {"a": [s([1.0]), None]},
                "xlabel": "rows",
                "ylabel": "ms",
                "logx": True,
            }
        ],
    )
    for path in (bars, lines):
        assert path is not None and path.read_bytes()[:8] == PNG_MAGIC


def test_plots_skip_cleanly_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plots, "available", lambda: False)
    assert plots.grouped_bars(tmp_path / "x.png", "t", "y", ["a"], {"omlx": [None]}) is None
    assert not (tmp_path / "x.png").exists()
    assert "matplotlib is not installed" in capsys.readouterr().out


def _trial(peer: str, round_: int, ttfts: dict[str, float], startup: float) -> dict:
    phases = {
        name: {"ttft": t, "text": "same", "prompt_tokens": 10, "cached_tokens": None}
        for name, t in ttfts.items()
    }
    return {
        "peer": peer,
        "round": round_,
        "phases": phases,
        "startup_s": startup,
        "first_startup_s": startup + 1,
        "port_open_s": startup / 2,
        "warmup_ttft_s": 0.1,
    }


def test_agent_loop_summary_rows_ratios_and_verdicts() -> None:
    names = agent_loop.phase_names(3)
    assert names[0] == "cold first turn" and names[-1] == "first request after a restart"
    assert [n for n in names if n.startswith("follow-up")] == [
        "follow-up turn 1",
        "follow-up turn 2",
    ]
    omlx = dict.fromkeys(names, 0.2) | {"cold first turn": 10.0}
    mlx = dict.fromkeys(names, 0.4) | {
        "cold first turn": 20.0,
        "first request after a restart": 20.0,
    }
    trials = [
        _trial("omlx", 0, omlx, 3.0),
        _trial("mlx_lm.server", 0, mlx, 2.0),
        _trial("omlx", 1, omlx | {"follow-up turn 1": 0.6}, 5.0),
        _trial("mlx_lm.server", 1, mlx, 2.0),
    ]
    result = agent_loop.summarize_trials(trials, ["omlx", "mlx_lm.server"], 3)
    follow = result["rows"]["follow-up turn 1"]["omlx"]
    assert (follow["median"], follow["min"], follow["max"], follow["n"]) == (0.4, 0.2, 0.6, 2)
    assert result["ratios"]["follow-up turn 1"]["mlx_lm.server"] == pytest.approx(1.0)
    assert result["ratios"]["cold first turn"]["mlx_lm.server"] == pytest.approx(0.5)
    assert result["rows"]["server start-up (spawn -> first token)"]["omlx"]["median"] == 4.0
    assert result["rows"]["first start on a new cache folder"]["omlx"]["median"] == 5.0
    json.dumps(result)  # what the bench writes must be JSON
    verdicts = agent_loop.verdicts(result, 3)
    assert any(
        v.startswith("follow-up turns, worst omlx/mlx_lm.server: 1.00") and "MISSED" in v
        for v in verdicts
    )
    assert any(v.startswith("cold turn") and "MET" in v for v in verdicts)
    assert any(v.startswith("start-up") and "MISSED" in v for v in verdicts)
    assert not any("llama.cpp" in v for v in verdicts)  # a peer left out gives no verdict


def test_index_scale_keys_chain_and_log_times() -> None:
    assert len(index_scale.key(0)) == 64 and index_scale.key(0) != index_scale.key(1)
    assert index_scale.key(5) == index_scale.key(5)
    t = index_scale.log_time(
        "2026-12-01 10:51:14,943 INFO omlx.app.wiring.bootstrap: cache folder reconciled"
    )
    assert t % 1 == pytest.approx(0.943, abs=1e-3)
    later = index_scale.log_time(
        "INFO - 2026-12-01 10:51:15,943 - omlx.app.wiring.bootstrap - reconciled"
    )
    assert later - t == pytest.approx(1.0)


def test_value_labels_sit_over_the_whisker_and_single_runs_have_none() -> None:
    s = summary.summarize
    spread, single = s([1.0, 2.0, 1.5]), s([0.3])
    assert plots.label_height(spread) == 2.0  # the whisker's top, not the 1.5 median
    assert plots.label_height(single) == 0.3
    assert plots._runs(spread) == 3 and plots._runs(single) == 1 and plots._runs(None) == 0
