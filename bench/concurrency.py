"""Aggregate decode tokens/s of omlx serve against mlx_lm.server (and llama.cpp) with N streams.

    .venv/bin/python bench/concurrency.py [--streams 1,2,4,8] [--tokens 128] [--reps 3]
                                          [--no-llama-cpp] [--json OUT]

Both servers load the same weights: the default GGUF converted by ``omlx convert``
into an mlx-lm folder (``--mlx-folder``, made once). For each stream count N, each
server is started fresh with N batch slots (``omlx serve --max-concurrent-requests N``;
``mlx_lm.server --decode-concurrency N --prompt-concurrency N``), the same 256-token
prefill step, and mlx_lm.server gets the same OpenBLAS omlx loads. N greedy streaming
chats start together, each asking for ``--tokens`` tokens (distinct prompts per
repetition, so no prefix is reused). Both servers are up for a stream count, bursts
alternate between them (the idle one sleeps), and each reports its median burst.

Aggregate decode tokens/s is taken where all N streams decode together: from the last
stream's first token to the first stream's last, tokens (content chunks) of all streams
in that stretch over its length. Start-up (arrival, templating, prefill) and tail are
left out, so a server that starts one stream early is not charged for the ramp. Bursts
run in pairs (omlx then mlx_lm.server, then the other way round), so besides the ratio
of the medians the table gives the median of the per-pair ratios, which cancels most
of a shared machine's drift.

llama.cpp's server (llama-cpp-python, built by scripts/install-llama-cpp.sh) joins at one
stream only: it serves one request at a time (a new request interrupts the running one by
default), so it has no concurrent rate. Writes ``bench/out/concurrency.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import plots
from common import (
    ROOT,
    default_gguf,
    ensure_mlx_lm_folder,
    first_model,
    fmt_ratio,
    free_port,
    llama_cpp_python,
    llama_cpp_server,
    load_average,
    machine_note,
    mlx_lm_server,
    omlx_server,
    process_cpu_seconds,
    table,
    versions,
)
from summary import fmt_spread, out_path, summarize, write_json

TOPICS = [
    "a lighthouse keeper who collects maps",
    "a baker on the moon",
    "two rival clockmakers",
    "a river that flows uphill",
    "a librarian who hears books",
    "a lost robot in a desert",
    "a city built on whales",
    "a chess game lasting a century",
]


def prompts(n: int, rep: int) -> list[list[dict[str, str]]]:
    return [
        [
            {
                "role": "user",
                "content": f"Story {rep}.{i}: write a long, detailed story about {TOPICS[i % len(TOPICS)]}.",
            }
        ]
        for i in range(n)
    ]


def stream_times(
    base_url: str, model: str, messages: list[dict[str, str]], max_tokens: int
) -> dict:
    """One greedy streaming chat: when it was sent, and when each content chunk arrived."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
    }
    stamps: list[float] = []
    sent = time.perf_counter()
    with (
        httpx.Client(timeout=600) as client,
        client.stream("POST", base_url + "/v1/chat/completions", json=body) as r,
    ):
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{base_url}: HTTP {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                stamps.append(time.perf_counter())
    return {"sent": sent, "stamps": stamps, "end": time.perf_counter()}


def burst(base_url: str, model: str, n: int, rep: int, tokens: int) -> dict:
    """N streams at once. The rate counts only the stretch where all N decode together.

    That stretch runs from the last stream's first token to the first stream's end;
    content chunks (one per token for this model's English text) inside it, over its length.
    """
    barrier = threading.Barrier(n)

    def one(messages):
        barrier.wait()
        return stream_times(base_url, model, messages, tokens)

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        runs = list(pool.map(one, prompts(n, rep)))
    begin = max(r["stamps"][0] for r in runs)
    finish = min(r["stamps"][-1] for r in runs)
    inside = sum(1 for r in runs for t in r["stamps"] if begin < t <= finish)
    return {
        "rate": inside / (finish - begin) if finish > begin else float("nan"),
        "tokens": sum(len(r["stamps"]) for r in runs),
        "ttft": statistics.median(r["stamps"][0] - r["sent"] for r in runs),
        "steady_s": finish - begin,
    }


def measure(servers: dict, n: int, tokens: int, reps: int) -> dict[str, dict]:
    """Both servers up at once (the idle one sleeps), bursts alternating so noise hits both alike."""
    rates: dict[str, list[float]] = {name: [] for name in servers}
    counts: dict[str, list[int]] = {name: [] for name in servers}
    ttfts: dict[str, list[float]] = {name: [] for name in servers}
    cpu_ms: dict[str, list[float]] = {name: [] for name in servers}
    for server, _ in servers.values():
        server.start()
    try:
        models = {
            name: model or first_model(server.base_url) for name, (server, model) in servers.items()
        }
        for name, (server, _) in servers.items():
            burst(server.base_url, models[name], 1, -1, 4)  # warm-up: first-request costs
        order = list(servers.items())
        for rep in range(reps):
            for name, (server, _) in order if rep % 2 == 0 else order[::-1]:
                time.sleep(1.0)  # let the previous server's last work settle
                cpu = process_cpu_seconds(server.proc.pid)
                result = burst(server.base_url, models[name], n, rep, tokens)
                rates[name].append(result["rate"])
                counts[name].append(result["tokens"])
                ttfts[name].append(result["ttft"])
                cpu_ms[name].append(
                    1000 * (process_cpu_seconds(server.proc.pid) - cpu) / result["tokens"]
                )
    finally:
        for server, _ in servers.values():
            server.stop()
    return {
        name: {
            "rate": statistics.median(r),
            "rates": [round(x, 2) for x in r],
            "summary": summarize(r),
            "tokens": counts[name],
            "cpu_ms_per_token": statistics.median(cpu_ms[name]),
            "ttft_s": statistics.median(ttfts[name]),
        }
        for name, r in rates.items()
    }


def plot(result: dict) -> None:
    counts = [r["streams"] for r in result["results"]]
    peers = ["omlx", "mlx_lm.server", "llama.cpp"]
    series = {
        p: [r.get(p, {}).get("summary") if r.get(p) else None for r in result["results"]]
        for p in peers
    }
    plots.grouped_bars(
        out_path("concurrency", ".png"),
        f"Decode tokens/s, all streams together ({result['args']['tokens']} tokens each; "
        f"median of {result['args']['reps']} bursts, whiskers min-max)",
        "tokens/s (aggregate)",
        [f"{n} stream{'s' if n > 1 else ''}" for n in counts],
        {p: v for p, v in series.items() if any(v)},
        note=f"omlx {result['versions']['omlx']}; {result['machine']}; llama.cpp: 1 stream only",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens per stream")
    parser.add_argument(
        "--reps", type=int, default=3, help="bursts per server and stream count (median)"
    )
    parser.add_argument("--prefill-step", type=int, default=256)
    parser.add_argument("--mlx-folder", type=Path, default=Path("/tmp/omlx-bench/smollm2-mlx"))
    parser.add_argument(
        "--no-llama-cpp", action="store_true", help="leave llama.cpp out of 1 stream"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="default: bench/out/concurrency.json"
    )
    args = parser.parse_args()

    folder = ensure_mlx_lm_folder(args.mlx_folder)
    counts = [int(x) for x in args.streams.split(",")]
    work = Path(tempfile.mkdtemp(prefix="omlx-concurrency-"))
    llama = llama_cpp_python() is not None and not args.no_llama_cpp
    result = {
        "machine": machine_note(),
        "versions": versions(),
        "args": vars(args),
        "load_average_start": load_average(),
    }
    print(result["machine"])
    print(
        f"weights {folder}; {args.tokens} tokens per stream, {args.reps} bursts each, prefill step {args.prefill_step}"
    )
    if not llama and not args.no_llama_cpp:
        print("note: llama.cpp not built (scripts/install-llama-cpp.sh): left out")
    rows, out = [], []
    t0 = time.perf_counter()
    for n in counts:
        step = ["--prefill-step-size", str(args.prefill_step)]
        servers = {
            "omlx": (
                omlx_server(
                    free_port(),
                    work / f"cache-{n}",
                    work / f"omlx-{n}.log",
                    ["--model", str(folder), "--max-concurrent-requests", str(n), *step],
                ),
                None,
            ),
            "mlx_lm.server": (
                mlx_lm_server(
                    free_port(),
                    folder,
                    work / f"mlx-lm-{n}.log",
                    ["--decode-concurrency", str(n), "--prompt-concurrency", str(n), *step],
                ),
                "default_model",
            ),
        }
        if llama and n == 1:
            servers["llama.cpp"] = (
                llama_cpp_server(
                    free_port(), default_gguf(), work / "llama-cpp.log", work / "llama-cpp"
                ),
                None,
            )
        measured = measure(servers, n, args.tokens, args.reps)
        ours, theirs = measured["omlx"], measured["mlx_lm.server"]
        for name, m in measured.items():
            print(
                f"{n} streams: {name} {m['rate']:.1f} tok/s {m['rates']} ({m['cpu_ms_per_token']:.0f} CPU ms/token, "
                f"TTFT {m['ttft_s']:.2f} s, tokens {m['tokens']})",
                flush=True,
            )
        paired = statistics.median(
            a / b for a, b in zip(ours["rates"], theirs["rates"], strict=True)
        )
        lc = measured.get("llama.cpp")
        rows.append(
            [
                n,
                fmt_spread(ours["summary"], "", 1),
                fmt_spread(theirs["summary"], "", 1),
                fmt_ratio(ours["rate"], theirs["rate"]),
                f"{paired:.2f}x",
                fmt_spread(lc["summary"], "", 1) if lc else "-",
                fmt_ratio(ours["rate"], lc["rate"]) if lc else "-",
                f"{ours['ttft_s']:.2f} / {theirs['ttft_s']:.2f}",
            ]
        )
        out.append({"streams": n, **measured, "paired_ratio_mlx_lm": paired})
    result["results"] = out
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["load_average_end"] = load_average()
    print()
    print(
        table(
            [
                "streams",
                "omlx tok/s",
                "mlx_lm.server tok/s",
                "omlx/mlx_lm (medians)",
                "median paired ratio",
                "llama.cpp tok/s",
                "omlx/llama.cpp",
                "TTFT s (omlx / mlx_lm)",
            ],
            rows,
        )
    )
    verdicts = []
    for entry in out:
        target = 1.1 if entry["streams"] >= 4 else 1.0
        r = entry["omlx"]["rate"] / entry["mlx_lm.server"]["rate"]
        verdicts.append(
            f"{entry['streams']} stream(s): omlx/mlx_lm.server {r:.2f}x (target >= {target}x) {'MET' if r >= target else 'MISSED'}"
        )
    result["verdicts"] = verdicts
    print("\n".join(verdicts))
    write_json("concurrency", result, args.json)
    plot(result)
    print(f"logs in {work} (run from {ROOT})")


if __name__ == "__main__":
    main()
