"""Tables, verdicts and plots of ``agent_trace``'s results (medians over repeats per step)."""

from __future__ import annotations

import statistics
from typing import Any

import plots
from common import table
from summary import out_path, summarize

MB = 1e6
DISRUPTIONS = ("sub-agent", "side calls", "second session", "compaction")


def per_step(model: dict[str, Any], peer: str, key: str) -> list[float | None]:
    """The median of ``key`` per step over ``peer``'s rounds (None where no round has it)."""
    runs = [r for r in model["runs"] if r["peer"] == peer]
    out = []
    for i in range(len(model["steps"])):
        values = [r["rows"][i].get(key) for r in runs if i < len(r["rows"])]
        values = [v for v in values if v is not None]
        out.append(statistics.median(values) if values else None)
    return out


def _peers(model: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["peer"] for r in model["runs"]))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def model_verdicts(model: dict[str, Any]) -> list[str]:
    """The issue-20 targets for one model, read from the per-step medians."""
    out: list[str] = []
    name, steps = model["model"], model["steps"]
    peers = _peers(model)

    def check(text: str, value: float | None, limit: float, fmt: str = "{:.2f}") -> None:
        if value is not None:
            verdict = "MET" if value <= limit else "MISSED"
            out.append(
                f"{name}: {text}: {fmt.format(value)} (target <= {fmt.format(limit)}) {verdict}"
            )

    ttft = {p: per_step(model, p, "ttft") for p in peers}
    share = per_step(model, "omlx", "reused_share")
    floor = per_step(model, "omlx", "floor_ttft")
    main = [i for i, s in enumerate(steps) if s["session"] == "main" and share[i] is not None]
    if main:
        worst = min(main, key=lambda i: share[i])
        out.append(
            f"{name}: main turns restoring >= 99% of what they share with the previous turn: "
            f"{sum(share[i] >= 0.99 for i in main)} of {len(main)} (worst {share[worst]:.3f}, "
            f"{steps[worst]['label']}) {'MET' if share[worst] >= 0.99 else 'MISSED'}"
        )
    plain = [i for i in main if steps[i]["after"] == "follow-up"]
    disrupted = [i for i in main if steps[i]["after"] in DISRUPTIONS]
    for group, limit, label in (
        (plain, 1.1, "plain follow-ups"),
        (disrupted, 1.2, "turns after a disruption"),
    ):
        ratios = [_ratio(ttft["omlx"][i], floor[i]) for i in group]
        ratios = [r for r in ratios if r is not None]
        check(f"{label}, worst omlx TTFT / its floor", max(ratios) if ratios else None, limit)
    for peer in peers:
        if peer == "omlx":
            continue
        ratios = {i: _ratio(ttft["omlx"][i], ttft[peer][i]) for i in main}
        plain_r = [ratios[i] for i in plain if ratios[i] is not None]
        check(f"plain follow-ups, worst omlx/{peer}", max(plain_r) if plain_r else None, 1.0)
        every = [r for r in ratios.values() if r is not None]
        check(f"every main turn, worst omlx/{peer}", max(every) if every else None, 1.0)
    omlx_runs = [r for r in model["runs"] if r["peer"] == "omlx"]
    restart = [i for i, s in enumerate(steps) if s["restart_before"]]
    cat = next((r["cat"] for r in omlx_runs if r.get("cat")), None)
    if restart and cat and floor[restart[0]] is not None:
        i = restart[0]
        read = per_step(model, "omlx", "ssd_bytes_read")[i] or 0
        bound = 1.3 * read / cat["bytes_per_s"] + floor[i]
        check(
            f"first turn after the restart ({read / MB:.0f} MB read; cat {cat['bytes_per_s'] / MB:.0f} MB/s), "
            "seconds",
            ttft["omlx"][i],
            bound,
            "{:.2f}",
        )
    if omlx_runs:
        disk = max(r["rows"][-1]["disk_bytes"] for r in omlx_runs)
        linear = model["kv_bytes_per_token"] * model["distinct_tokens"]
        check("disk bytes / (KV bytes per token x distinct tokens)", disk / linear, 1.1)
        rss = max(max(x["rss_bytes"] or 0 for x in r["rows"]) for r in omlx_runs)
        hot_max = max(x.get("hot_tier_max_bytes") or 0 for x in omlx_runs[0]["rows"])
        batch = max(s["prompt_tokens"] for s in steps) * model["kv_bytes_per_token"]
        budget = model["weights_bytes"] + hot_max + batch
        check(
            f"RSS / (weights + hot budget + one request's KV = {budget / MB:.0f} MB)",
            rss / budget,
            1.1,
        )
    return out


def verdicts(result: dict[str, Any]) -> list[str]:
    return [v for m in result["models"] for v in model_verdicts(m)]


def _fmt(v: float | None, spec: str = "{:.2f}") -> str:
    return "-" if v is None else spec.format(v)


def model_table(model: dict[str, Any]) -> str:
    peers = _peers(model)
    ttft = {p: per_step(model, p, "ttft") for p in peers}
    cols = {
        k: per_step(model, "omlx", k)
        for k in (
            "cached_tokens",
            "shared_tokens",
            "reused_share",
            "floor_ttft",
            "hot_bytes_read",
            "ssd_bytes_read",
        )
    }
    peer_cached = {p: per_step(model, p, "cached_tokens") for p in peers if p != "omlx"}
    headers = [
        "request",
        "tokens",
        *(f"{p} TTFT s" for p in peers),
        "omlx floor s",
        "omlx cached / shared",
        "omlx read hot / ssd MB",
        *(f"{p} cached" for p in peer_cached),
        *(f"omlx/{p}" for p in peers if p != "omlx"),
    ]
    rows = []
    for i, s in enumerate(model["steps"]):
        shared = cols["shared_tokens"][i]
        rows.append(
            [
                s["label"] + (" [restart]" if s["restart_before"] else ""),
                s["prompt_tokens"],
                *(_fmt(ttft[p][i]) for p in peers),
                _fmt(cols["floor_ttft"][i]),
                f"{_fmt(cols['cached_tokens'][i], '{:.0f}')} / {_fmt(shared, '{:.0f}') if shared else '-'}"
                + (
                    f" ({cols['reused_share'][i]:.1%})"
                    if cols["reused_share"][i] is not None
                    else ""
                ),
                f"{_fmt((cols['hot_bytes_read'][i] or 0) / MB, '{:.0f}')} / {_fmt((cols['ssd_bytes_read'][i] or 0) / MB, '{:.0f}')}",
                *(_fmt(peer_cached[p][i], "{:.0f}") for p in peer_cached),
                *(
                    _fmt(_ratio(ttft["omlx"][i], ttft[p][i]), "{:.2f}x")
                    for p in peers
                    if p != "omlx"
                ),
            ]
        )
    return table(headers, rows)


def footprint_table(model: dict[str, Any]) -> str:
    peers = _peers(model)
    rows = []
    for p in peers:
        rss = [v for v in per_step(model, p, "rss_bytes") if v is not None]
        disk = [v for v in per_step(model, p, "disk_bytes") if v is not None]
        hot = [v for v in per_step(model, p, "hot_tier_bytes") if v is not None]
        rows.append(
            [
                p,
                _fmt(max(rss) / MB if rss else None, "{:.0f}"),
                _fmt(max(hot) / MB if hot else None, "{:.0f}"),
                _fmt(disk[-1] / MB if disk else None, "{:.0f}"),
            ]
        )
    return table(["peer", "peak RSS MB", "peak hot tier MB", "disk at the end MB"], rows)


def report(result: dict[str, Any]) -> None:
    for model in result["models"]:
        print(
            f"\n### {model['model']} ({model['geometry']}, {model['kv_bytes_per_token']} B/token, "
            f"scale {model['scale']}; medians of {result['args']['repeats']} run(s))"
        )
        print(model_table(model))
        print("\nFootprint over the run")
        print(footprint_table(model))
        cat = next((r["cat"] for r in model["runs"] if r.get("cat")), None)
        if cat:
            print(
                f"cat of omlx's {cat['files']} block files: {cat['bytes'] / MB:.0f} MB in "
                f"{cat['seconds']:.2f} s = {cat['bytes_per_s'] / MB:.0f} MB/s (page cache as it was)"
            )
    for note in result["skipped"].values():
        print(f"note: {note}")
    print("\n" + "\n".join(result["verdicts"]))


def plot(result: dict[str, Any]) -> None:
    note = f"omlx {result['versions']['omlx']}; {result['machine']}"
    for model in result["models"]:
        peers = _peers(model)
        main = [i for i, s in enumerate(model["steps"]) if s["session"] == "main"]
        labels = [model["steps"][i]["label"].replace(" (", "\n(") for i in main]
        series = {p: [summarize([per_step(model, p, "ttft")[i]]) for i in main] for p in peers}
        series["omlx floor"] = [summarize([per_step(model, "omlx", "floor_ttft")[i]]) for i in main]
        plots.grouped_bars(
            out_path(f"agent_trace_{model['model']}", ".png"),
            f"Agent trace, {model['model']} model: TTFT of each main-session turn",
            "seconds (log scale)",
            labels,
            series,
            log=True,
            note=note,
            labels=False,
        )
        xs = list(range(1, len(model["steps"]) + 1))
        panels = [
            {
                "x": xs,
                "xlabel": "request of the trace",
                "ylabel": "MB",
                "title": "RSS",
                "series": {
                    p: [summarize([v / MB if v else None]) for v in per_step(model, p, "rss_bytes")]
                    for p in peers
                },
            },
            {
                "x": xs,
                "xlabel": "request of the trace",
                "ylabel": "MB",
                "title": "cache on disk",
                "series": {
                    p: [
                        summarize([v / MB if v is not None else None])
                        for v in per_step(model, p, "disk_bytes")
                    ]
                    for p in peers
                },
            },
            {
                "x": xs,
                "xlabel": "request of the trace",
                "ylabel": "MB",
                "title": "omlx hot tier",
                "series": {
                    "omlx": [
                        summarize([v / MB if v is not None else None])
                        for v in per_step(model, "omlx", "hot_tier_bytes")
                    ]
                },
            },
        ]
        plots.line_panels(
            out_path(f"agent_trace_{model['model']}_footprint", ".png"),
            f"Agent trace, {model['model']} model: footprint over the run",
            panels,
            note=note,
        )
