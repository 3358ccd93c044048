"""Aggregate decode tokens/s of omlx serve against mlx_lm.server with 1, 2, 4 and 8 streams.

    .venv/bin/python bench/concurrency.py [--streams 1,2,4,8] [--tokens 64] [--reps 2]

Both servers load the same weights: the default GGUF converted by ``omlx convert``
into an mlx-lm folder (``--mlx-folder``, made once). For each stream count N, each
server is started fresh with N batch slots (``omlx serve --max-concurrent-requests N``;
``mlx_lm.server --decode-concurrency N --prompt-concurrency N``), the same 256-token
prefill step, and mlx_lm.server gets the same OpenBLAS omlx loads. N greedy streaming
chats start together, each asking for ``--tokens`` tokens (distinct prompts per
repetition, so no prefix is reused). Both servers are up for a stream count, bursts
alternate between them (the idle one sleeps), and each reports its median burst.

Aggregate decode tokens/s = (sum of completion tokens - N) / (last stream end - first
first token): every token after each stream's first, over the decode window.
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
from common import (
    ROOT,
    ensure_mlx_lm_folder,
    fmt_ratio,
    free_port,
    machine_note,
    mlx_lm_server,
    omlx_server,
    process_cpu_seconds,
    stream_chat,
    table,
)

TOPICS = [
    "a lighthouse keeper who collects maps", "a baker on the moon", "two rival clockmakers",
    "a river that flows uphill", "a librarian who hears books", "a lost robot in a desert",
    "a city built on whales", "a chess game lasting a century",
]


def prompts(n: int, rep: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Story {rep}.{i}: write a long, detailed story about {TOPICS[i % len(TOPICS)]}."}]
        for i in range(n)
    ]


def burst(base_url: str, model: str, n: int, rep: int, tokens: int) -> dict:
    """N streams at once; the decode window's aggregate rate."""
    barrier = threading.Barrier(n)

    def one(messages):
        barrier.wait()
        t0 = time.perf_counter()
        result = stream_chat(base_url, model, messages, tokens)
        return t0 + result.ttft, t0 + result.total, result.completion_tokens or 0

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, prompts(n, rep)))
    first = min(r[0] for r in results)
    end = max(r[1] for r in results)
    generated = sum(r[2] for r in results)
    return {
        "rate": (generated - n) / (end - first),
        "tokens": generated,
        "window_s": end - first,
    }


def measure(servers: dict, n: int, tokens: int, reps: int) -> dict[str, dict]:
    """Both servers up at once (the idle one sleeps), bursts alternating so noise hits both alike."""
    rates: dict[str, list[float]] = {name: [] for name in servers}
    counts: dict[str, list[int]] = {name: [] for name in servers}
    cpu_ms: dict[str, list[float]] = {name: [] for name in servers}
    for server, _ in servers.values():
        server.start()
    try:
        models = {name: model or served_model(server.base_url) for name, (server, model) in servers.items()}
        for name, (server, _) in servers.items():
            burst(server.base_url, models[name], 1, -1, 4)  # warm-up: first-request costs
        order = list(servers.items())
        for rep in range(reps):
            for name, (server, _) in order if rep % 2 == 0 else order[::-1]:
                cpu = process_cpu_seconds(server.proc.pid)
                result = burst(server.base_url, models[name], n, rep, tokens)
                rates[name].append(result["rate"])
                counts[name].append(result["tokens"])
                cpu_ms[name].append(1000 * (process_cpu_seconds(server.proc.pid) - cpu) / result["tokens"])
    finally:
        for server, _ in servers.values():
            server.stop()
    return {
        name: {
            "rate": statistics.median(r),
            "rates": [round(x, 2) for x in r],
            "tokens": counts[name],
            "cpu_ms_per_token": statistics.median(cpu_ms[name]),
        }
        for name, r in rates.items()
    }


def served_model(base_url: str) -> str:
    return httpx.get(base_url + "/v1/models", timeout=10).json()["data"][0]["id"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens per stream")
    parser.add_argument("--reps", type=int, default=3, help="bursts per server and stream count (median)")
    parser.add_argument("--prefill-step", type=int, default=256)
    parser.add_argument("--mlx-folder", type=Path, default=Path("/tmp/smol-mlx"))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    folder = ensure_mlx_lm_folder(args.mlx_folder)
    counts = [int(x) for x in args.streams.split(",")]
    work = Path(tempfile.mkdtemp(prefix="omlx-concurrency-"))
    print(machine_note())
    print(f"weights {folder}; {args.tokens} tokens per stream, {args.reps} bursts each, prefill step {args.prefill_step}")
    rows, out = [], []
    for n in counts:
        step = ["--prefill-step-size", str(args.prefill_step)]
        ours_server = omlx_server(
            free_port(), work / f"cache-{n}", work / f"omlx-{n}.log",
            ["--model", str(folder), "--max-concurrent-requests", str(n), *step],
        )
        theirs_server = mlx_lm_server(
            free_port(), folder, work / f"mlx-lm-{n}.log",
            ["--decode-concurrency", str(n), "--prompt-concurrency", str(n), *step],
        )
        result = measure({"omlx": (ours_server, None), "mlx_lm": (theirs_server, "default_model")}, n, args.tokens, args.reps)
        ours, theirs = result["omlx"], result["mlx_lm"]
        print(
            f"{n} streams: omlx {ours['rate']:.1f} tok/s {ours['rates']} ({ours['cpu_ms_per_token']:.0f} CPU ms/token), "
            f"mlx_lm.server {theirs['rate']:.1f} tok/s {theirs['rates']} ({theirs['cpu_ms_per_token']:.0f} CPU ms/token); "
            f"tokens {ours['tokens']} vs {theirs['tokens']}",
            flush=True,
        )
        rows.append([n, f"{ours['rate']:.1f}", f"{theirs['rate']:.1f}", fmt_ratio(ours["rate"], theirs["rate"])])
        out.append({"streams": n, "omlx": ours, "mlx_lm_server": theirs})
    print()
    print(table(["streams", "omlx tok/s", "mlx_lm.server tok/s", "omlx / mlx_lm"], rows))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_note(), "results": out}, indent=2))
    print(f"logs in {work} (run from {ROOT})")


if __name__ == "__main__":
    main()
