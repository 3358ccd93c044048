"""Replay real agent traces (kv-cache-tester format) against omlx; cached tokens against a perfect cache.

    .venv/bin/python bench/trace_replay.py [--traces DIR] [--only trace_0012,trace_0291]
                                           [--modes sequential,interleaved,restart] [--scale 0.1]
                                           [--max-context TOKENS] [--hot-bytes SIZE | --hot-share 0.14]
                                           [--restarts 1] [--model long] [--json OUT]

Each trace (``bench/traces/kv-cache-tester`` by default: public Claude Code sessions) is
turned into prompts of token ids, a deterministic run per 64-token hash id (``kvtrace``), sent
to ``/v1/completions`` as token ids, so no template or re-tokenization stands between the
trace's blocks and omlx's. Sub-agents started together run concurrently; the parent waits
for them, as Claude Code does. Three modes, each on a fresh cache:

- ``sequential``: one conversation after another;
- ``interleaved``: every conversation's next turn in rotation, the hot tier capped
  (``--hot-bytes``, or ``--hot-share`` of the replay's distinct blocks);
- ``restart``: the rotation again, the server stopped and started again ``--restarts`` times.

Per request and in total: usage's cached tokens against a perfect cache's (the longest
prefix of hash ids sent before, in tokens, less the one token always prefilled), prefill
amplification (tokens prefilled / tokens a perfect cache prefills), TTFT, the tier the
blocks came from (``/metrics``) and the ``x-omlx-cache`` header, against the trace's own
hit rate (computed from its hash ids: the format records no cache counts). Writes
``bench/out/trace_replay.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kvtrace as kt
from agent_trace import model_target, omlx_counters
from common import Server, first_model, free_port, load_average, machine_note, omlx_server, table
from common import versions as engine_versions
from summary import ROOT, write_json

PUBLIC_TRACES = ROOT / "bench" / "traces" / "kv-cache-tester"
MODES = ("sequential", "interleaved", "restart")
PAST = 100_000  # the bar: traces replayed past this many tokens
READ_TIMEOUT_S = 900.0  # between two SSE lines; omlx sends a keepalive every few seconds


@dataclass
class Replay:
    """One mode's run: the server, the perfect caches and the rows, shared by sub-agent threads."""

    name: str
    server: Server
    model: str
    max_tokens: int
    synth: dict[str, kt.Synthesizer]
    sent: kt.PerfectCache = field(default_factory=kt.PerfectCache)  # dispatched before
    done: kt.PerfectCache = field(default_factory=kt.PerfectCache)  # answered before
    rows: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    after_restart: bool = False

    def request(self, trace: kt.Trace, request: kt.TraceRequest, place: str) -> None:
        synth = self.synth[trace.id]
        tokens = synth.prompt(request, place)
        per_block = synth.scale.block_tokens
        with self.lock:  # the ideal is the prefix sent before this one, in dispatch order
            ideal = kt.ideal_cached(
                self.sent.held(trace.id, request.hash_ids), per_block, len(tokens)
            )
            ideal_held = kt.ideal_cached(
                self.done.held(trace.id, request.hash_ids), per_block, len(tokens)
            )
            self.sent.add(trace.id, request.hash_ids)
            first_after_restart, self.after_restart = self.after_restart, False
        out = stream_completion(
            self.server.base_url,
            self.model,
            tokens,
            min(request.output_tokens or 1, self.max_tokens),
        )
        with self.lock:
            self.done.add(trace.id, request.hash_ids)
            row = {
                "trace": trace.id,
                "place": place,
                "prompt_tokens": out["prompt_tokens"],
                "sent_tokens": len(tokens),
                "cached_tokens": out["cached_tokens"],
                "ideal": ideal,
                "ideal_held": ideal_held,
                "prefilled": out["prompt_tokens"] - out["cached_tokens"],
                "ideal_prefill": len(tokens) - ideal,
                "ttft": out["ttft"],
                "total_s": out["total"],
                "header_cached": out["header_cached"],
                "header_tier": out["header_tier"],
                "after_restart": first_after_restart,
            }
            self.rows.append(row)
        gap = "" if row["cached_tokens"] == ideal else f"  <- ideal {ideal}"
        print(
            f"  {self.name} {trace.id} #{place}: prompt {row['prompt_tokens']}, cached "
            f"{row['cached_tokens']} (header {row['header_cached']}, {row['header_tier']}), "
            f"TTFT {row['ttft']:.2f} s{gap}",
            flush=True,
        )

    def run_steps(self, trace: kt.Trace, steps: tuple[kt.Step, ...], where: str) -> None:
        for i, step in enumerate(steps):
            self.run_step(trace, step, f"{where}{i}")

    def run_step(self, trace: kt.Trace, step: kt.Step, place: str) -> None:
        if isinstance(step, kt.TraceRequest):
            self.request(trace, step, place)
            return
        threads = [
            threading.Thread(
                target=self.run_steps, args=(trace, agent.steps, f"{place}/{agent.agent_id}/")
            )
            for agent in step.agents
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def parent_step(self, trace: kt.Trace, step: kt.Step, index: int) -> None:
        """One turn of a conversation (a request, or sub-agents together) with its tier counts."""
        before = omlx_counters(self.server.base_url)
        first_row = len(self.rows)
        self.run_step(trace, step, str(index))
        after = omlx_counters(self.server.base_url)
        self.steps.append(
            {
                "trace": trace.id,
                "index": index,
                "requests": len(self.rows) - first_row,
                "subagents": isinstance(step, kt.SubAgentGroup),
                "hot_blocks": int(after["hot_blocks"] - before["hot_blocks"]),
                "ssd_blocks": int(after["ssd_blocks"] - before["ssd_blocks"]),
                "hot_bytes": int(after["hot_bytes"]),
            }
        )
        if len(self.rows) - first_row == 1:  # a lone request: its blocks' tiers are its own
            self.rows[-1]["hot_blocks"] = self.steps[-1]["hot_blocks"]
            self.rows[-1]["ssd_blocks"] = self.steps[-1]["ssd_blocks"]


def stream_completion(
    base_url: str, model: str, tokens: list[int], max_tokens: int
) -> dict[str, Any]:
    """POST /v1/completions with token ids, streamed: TTFT to the first token's event, usage, header."""
    body = {
        "model": model,
        "prompt": tokens,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timeout = httpx.Timeout(60.0, read=READ_TIMEOUT_S)
    ttft = None
    usage: dict[str, Any] = {}
    t0 = time.perf_counter()
    with (
        httpx.Client(timeout=timeout) as client,
        client.stream("POST", base_url + "/v1/completions", json=body) as response,
    ):
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")
        header_cached, header_tier = kt.cache_header(response.headers.get("x-omlx-cache"))
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue  # separators and keepalive comments during a long prefill
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if ttft is None and chunk.get("choices"):
                ttft = time.perf_counter() - t0  # a token's event, even one with no text yet
            usage = chunk.get("usage") or usage
    total = time.perf_counter() - t0
    return {
        "ttft": ttft if ttft is not None else total,
        "total": total,
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        "header_cached": header_cached,
        "header_tier": header_tier,
    }


def vocabulary(folder: Path) -> kt.Vocabulary:
    """The model's token ids less the special tokens at either end of the vocabulary."""
    size = json.loads((folder / "config.json").read_text())["vocab_size"]
    special = {
        t["id"]
        for t in json.loads((folder / "tokenizer.json").read_text()).get("added_tokens", ())
        if t.get("special")
    }
    low, high = 0, size
    while low in special:
        low += 1
    while high - 1 in special:
        high -= 1
    return kt.Vocabulary(low, high)


def prepared(traces: list[kt.Trace], scale: float, limit: int) -> list[kt.Trace]:
    """Each trace cut where a request would pass ``limit`` tokens at ``scale``."""
    out = []
    for trace in traces:
        length = kt.Scale(trace.block_size, scale).prompt_tokens
        steps = kt.within_context(trace.steps, length, limit)
        if steps:
            out.append(kt.Trace(**{**_fields(trace), "steps": steps}))
    return out


def _fields(trace: kt.Trace) -> dict[str, Any]:
    return {name: getattr(trace, name) for name in trace.__dataclass_fields__}


def run_mode(mode: str, traces: list[kt.Trace], args, target, workdir: Path) -> dict[str, Any]:
    run_dir = workdir / mode
    extra = ["--block-size", str(args.block_size), *args.omlx_arg]
    if target["omlx_model"]:
        extra = ["--model", str(target["omlx_model"]), *extra]
    hot = None
    if mode != "sequential":
        hot = args.hot_bytes or int(args.hot_share * args.working_set_bytes)
        extra += ["--hot-cache-max-size", str(hot)]

    def start(n: int) -> Server:
        server = omlx_server(free_port(), run_dir / "cache", run_dir / f"start-{n}.log", extra)
        server.start(timeout=600)
        return server

    vocab = vocabulary(target["folder"])
    synth = {t.id: kt.Synthesizer(t.id, kt.Scale(t.block_size, args.scale), vocab) for t in traces}
    server = start(1)
    replay = Replay(mode, server, first_model(server.base_url), args.max_tokens, synth)
    if mode == "sequential":
        order = [(k, i, s) for k, t in enumerate(traces) for i, s in enumerate(t.steps)]
    else:
        turns = kt.round_robin([list(enumerate(t.steps)) for t in traces])
        order = [(k, i, s) for k, (i, s) in turns]
    restarts = kt.restart_points(len(order), args.restarts) if mode == "restart" else set()
    restart_ready: list[float] = []
    print(
        f"\n## {mode}: {len(traces)} traces, {len(order)} turns"
        + (f", hot tier {hot / 1e6:.1f} MB" if hot else "")
        + (f", restarts before turns {sorted(restarts)}" if restarts else ""),
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        for n, (k, index, step) in enumerate(order):
            if n in restarts:
                server.stop()
                server = start(len(restart_ready) + 2)
                restart_ready.append(server.ready_s)
                replay.server, replay.after_restart = server, True
            replay.parent_step(traces[k], step, index)
        server.stop()
    finally:
        server.kill()
    return {
        "mode": mode,
        "hot_max_bytes": hot,
        "restarts_before": sorted(restarts),
        "restart_ready_s": restart_ready,
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_average_end": load_average(),
        "rows": replay.rows,
        "steps": replay.steps,
    }


def mode_summary(run: dict[str, Any], trace_ids: list[str], block_size: int) -> dict[str, Any]:
    rows = run["rows"]
    total = kt.account(rows)
    # What a cache reusing whole server blocks only would hold (omlx matches below a block).
    total["ideal_whole_blocks"] = sum(r["ideal"] // block_size * block_size for r in rows)
    held = kt.account(rows, "ideal_held")
    total["cached_vs_ideal_held"] = held["cached_vs_ideal"]
    total["header_equals_usage"] = sum(r["header_cached"] == r["cached_tokens"] for r in rows)
    total["requests"] = len(rows)
    total["hot_blocks"] = sum(s["hot_blocks"] for s in run["steps"])
    total["ssd_blocks"] = sum(s["ssd_blocks"] for s in run["steps"])
    follow = [r["ttft"] for r in rows if r["ideal"] > 0]
    total["ttft_median_follow_ups"] = statistics.median(follow) if follow else None
    per_trace = {}
    for trace_id in trace_ids:
        mine = [r for r in rows if r["trace"] == trace_id]
        steps = [s for s in run["steps"] if s["trace"] == trace_id]
        per_trace[trace_id] = {
            **kt.account(mine),
            "requests": len(mine),
            "max_prompt_tokens": max((r["prompt_tokens"] for r in mine), default=0),
            "ttft_median": statistics.median(r["ttft"] for r in mine) if mine else None,
            "hot_blocks": sum(s["hot_blocks"] for s in steps),
            "ssd_blocks": sum(s["ssd_blocks"] for s in steps),
        }
    return {"total": total, "per_trace": per_trace}


def verdicts(result: dict[str, Any]) -> list[str]:
    out = []
    for run in result["runs"]:
        t = run["summary"]["total"]
        mode = run["mode"]
        if t["cached_vs_ideal"] is not None:
            ok = t["cached_vs_ideal"] >= 0.999
            out.append(
                f"{mode}: cached {t['cached_tokens']} of a perfect cache's {t['ideal_tokens']} = "
                f"{t['cached_vs_ideal']:.4f} (target >= 0.999) {'MET' if ok else 'MISSED'}"
            )
        if t["amplification"] is not None:
            ok = t["amplification"] <= 1.01
            out.append(
                f"{mode}: prefill amplification {t['amplification']:.4f} (target <= 1.01) "
                f"{'MET' if ok else 'MISSED'}"
            )
        out.append(
            f"{mode}: x-omlx-cache cached equals usage on {t['header_equals_usage']} of "
            f"{t['requests']} requests {'MET' if t['header_equals_usage'] == t['requests'] else 'MISSED'}"
        )
    long = sorted(
        {
            trace
            for run in result["runs"]
            for trace, s in run["summary"]["per_trace"].items()
            if s["max_prompt_tokens"] > PAST
        }
    )
    out.append(
        f"traces replayed past {PAST} tokens: {len(long)} ({', '.join(long) or 'none'}) "
        f"(target >= 2) {'MET' if len(long) >= 2 else 'MISSED'}"
    )
    return out


def report(result: dict[str, Any]) -> None:
    for run in result["runs"]:
        print(f"\n### {run['mode']}" + (f" ({run['wall_s']:.0f} s)" if "wall_s" in run else ""))
        rows = []
        for trace, s in run["summary"]["per_trace"].items():
            rows.append(
                [
                    trace,
                    s["requests"],
                    s["max_prompt_tokens"],
                    s["prompt_tokens"],
                    s["ideal_tokens"],
                    s["cached_tokens"],
                    _f(s["cached_vs_ideal"], "{:.4f}"),
                    _f(s["amplification"], "{:.4f}"),
                    _f(result["trace_hit_rate"].get(trace), "{:.3f}"),
                    _f(
                        s["cached_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else None,
                        "{:.3f}",
                    ),
                    _f(s["ttft_median"], "{:.2f}"),
                    f"{s['hot_blocks']} / {s['ssd_blocks']}",
                ]
            )
        t = run["summary"]["total"]
        rows.append(
            [
                "all",
                t["requests"],
                max(s["max_prompt_tokens"] for s in run["summary"]["per_trace"].values()),
                t["prompt_tokens"],
                t["ideal_tokens"],
                t["cached_tokens"],
                _f(t["cached_vs_ideal"], "{:.4f}"),
                _f(t["amplification"], "{:.4f}"),
                "",
                _f(
                    t["cached_tokens"] / t["prompt_tokens"] if t["prompt_tokens"] else None,
                    "{:.3f}",
                ),
                _f(t["ttft_median_follow_ups"], "{:.2f}"),
                f"{t['hot_blocks']} / {t['ssd_blocks']}",
            ]
        )
        print(
            table(
                [
                    "trace",
                    "requests",
                    "longest",
                    "prompt tokens",
                    "perfect cache",
                    "cached",
                    "cached / perfect",
                    "amplification",
                    "trace hit rate",
                    "replay hit rate",
                    "TTFT median s",
                    "blocks hot / ssd",
                ],
                rows,
            )
        )
        print(
            f"cached / the prefix answered before each request was sent: "
            f"{_f(t['cached_vs_ideal_held'], '{:.4f}')}; TTFT median of follow-ups "
            f"{_f(t['ttft_median_follow_ups'], '{:.2f} s')}; whole {result['args']['block_size']}-token "
            f"blocks of the perfect cache: {t['ideal_whole_blocks']}"
            + (
                f"; restarts ready in {', '.join(f'{x:.1f} s' for x in run['restart_ready_s'])}"
                if run.get("restart_ready_s")
                else ""
            )
        )
        short = sorted(
            (r for r in run["rows"] if r["cached_tokens"] < r["ideal"]),
            key=lambda r: r["cached_tokens"] - r["ideal"],
        )
        for r in short[:5]:
            print(
                f"  short: {r['trace']} #{r['place']}: cached {r['cached_tokens']} of "
                f"{r['ideal']} (prompt {r['prompt_tokens']}, answered before: {r['ideal_held']})"
            )
    print()
    for v in result["verdicts"]:
        print(v)


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def rereport(path: Path, out: Path | None) -> None:
    """Summaries, verdicts and tables again from a saved run's rows (written to ``out`` if given)."""
    result = json.loads(path.read_text())
    for run in result["runs"]:
        trace_ids = list(dict.fromkeys(r["trace"] for r in run["rows"]))
        run["summary"] = mode_summary(run, trace_ids, result["args"]["block_size"])
    result["verdicts"] = verdicts(result)
    report(result)
    if out:
        write_json("trace_replay", result, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces", type=Path, default=PUBLIC_TRACES, help="a folder of trace JSON files"
    )
    parser.add_argument("--only", default="", help="comma-separated trace ids (default: all)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated of {MODES}")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="of the recorded token counts (0.1: a tenth)"
    )
    parser.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="cut a conversation before its first longer request (default: the model's context)",
    )
    parser.add_argument("--max-tokens", type=int, default=1, help="output tokens per request")
    parser.add_argument(
        "--hot-bytes", type=int, default=None, help="the hot tier's budget in interleaved modes"
    )
    parser.add_argument(
        "--hot-share",
        type=float,
        default=1 / 7,
        help="without --hot-bytes: the hot tier as a share of the replay's distinct blocks' KV",
    )
    parser.add_argument("--restarts", type=int, default=1, help="server restarts in mode restart")
    parser.add_argument("--model", default="long", help="long, 8b-geometry or default")
    parser.add_argument("--block-size", type=int, default=64, help="omlx's block size (tokens)")
    parser.add_argument("--omlx-arg", action="append", default=[], help="more `omlx serve` flags")
    parser.add_argument(
        "--json", type=Path, default=None, help="default bench/out/trace_replay.json"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (caches, logs)")
    parser.add_argument(
        "--report", type=Path, default=None, help="no run: summarize and print a saved JSON"
    )
    args = parser.parse_args()
    if args.report:
        rereport(args.report, args.json)
        return
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}")
    traces = kt.load_traces(args.traces)
    if args.only:
        wanted = set(args.only.split(","))
        traces = [t for t in traces if t.id in wanted or Path(t.source).stem in wanted]
        if missing := wanted - {t.id for t in traces} - {Path(t.source).stem for t in traces}:
            parser.error(f"no such traces in {args.traces}: {sorted(missing)}")
    if not traces:
        parser.error(f"no traces in {args.traces}")
    target = model_target(args.model, None)
    limit = min(args.max_context or target["context"], target["context"] - args.max_tokens)
    traces = prepared(traces, args.scale, limit)
    block_tokens = {t.id: kt.Scale(t.block_size, args.scale).block_tokens for t in traces}
    distinct = kt.distinct_blocks(traces)
    args.working_set_bytes = (
        sum(kt.distinct_blocks([t]) * block_tokens[t.id] for t in traces)
        * target["kv_bytes_per_token"]
    )
    result: dict[str, Any] = {
        "machine": machine_note(),
        "versions": engine_versions(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": {k: str(v) if isinstance(v, Path) else v for k, v in target.items()},
        "max_context": limit,
        "distinct_blocks": distinct,
        "working_set_bytes": args.working_set_bytes,
        "trace_hit_rate": {t.id: kt.trace_hit_rate(t) for t in traces},
        "load_average_start": load_average(),
        "runs": [],
    }
    print(
        f"machine: {result['machine']}; load average {result['load_average_start']}\n"
        f"{len(traces)} traces from {args.traces}, scale {args.scale}, up to {limit} tokens; "
        f"{distinct} distinct blocks, {args.working_set_bytes / 1e6:.1f} MB of KV on {args.model}",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="omlx-trace-replay-"))
    partial = args.json.with_name(args.json.stem + "_partial.json") if args.json else None
    try:
        for mode in modes:
            run = run_mode(mode, traces, args, target, workdir)
            run["summary"] = mode_summary(run, [t.id for t in traces], args.block_size)
            result["runs"].append(run)
            write_json("trace_replay_partial", {**result}, partial)
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["load_average_end"] = load_average()
    result["verdicts"] = verdicts(result)
    report(result)
    write_json("trace_replay", result, args.json)


if __name__ == "__main__":
    main()
