"""Warm restart: the first turn after a restart against a RAM hit and a disk restore.

    .venv/bin/python bench/warm_restart.py [--tokens 8192] [--layers 24] [--repeats 3] [--json OUT]

An 8B-geometry model (``bench_models``: random weights, an 8B model's KV per token), one
session of ``--tokens`` prompt tokens computed once. Then per repeat, interleaved: (b) the
same turn again on the running server (a RAM hit), a clean stop; (a) a start with warm
restart, waiting on /health for its prefetch to finish, then the turn; (c) a start with
``--no-warm-restart``, then the turn (today's restore from disk). TTFT is the wall time of
a one-token completion. Also the prefetch's read rate (bytes read back / its seconds, from
/health) against ``cat`` of the same block files. The page cache is dropped before each
start and each ``cat`` where this user may (else every rate is a page-cache rate, and the
output says so). Targets: (a) <= 1.2x (b); prefetch >= 0.8x ``cat``. Medians.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_models
from common import (
    default_gguf,
    drop_page_cache,
    ensure_mlx_lm_folder,
    first_model,
    free_port,
    machine_note,
    omlx_server,
    table,
)
from summary import write_json

WORDS = [
    "agent",
    "file",
    "repository",
    "test",
    "build",
    "module",
    "cache",
    "block",
    "index",
    "server",
    "request",
    "token",
    "model",
    "prefix",
    "restore",
    "disk",
    "memory",
    "thread",
    "engine",
    "batch",
    "commit",
    "branch",
    "merge",
    "review",
    "patch",
]


def prompt_text(tokens: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


def ttft(base_url: str, text: str) -> tuple[float, dict]:
    """Wall time of a one-token completion of ``text``, and its usage."""
    model = first_model(base_url)
    t0 = time.perf_counter()
    r = httpx.post(
        base_url + "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 1,
            "temperature": 0,
        },
        timeout=3600,
    )
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["usage"] | {"cache": r.headers["x-omlx-cache"]}


def wait_prefetch(base_url: str, timeout: float = 600.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = httpx.get(base_url + "/health").json()
        warm = next(iter(health["models"].values()))["cache"]["warm_restart"]
        if warm["state"] != "running":
            return warm
        time.sleep(0.05)
    raise SystemExit("the prefetch did not finish")


def cat_seconds(paths: list[Path]) -> float:
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=None, help="default: the geometry's 24")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    g = bench_models.geometry("8b-geometry", args.layers)
    folder = bench_models.build(g, ensure_mlx_lm_folder(), default_gguf())
    text = prompt_text(args.tokens)
    work = Path(tempfile.mkdtemp(prefix="omlx-warm-"))
    cache = work / "cache"
    model = ["--model", str(folder), "--hot-cache-max-size", "8GB"]
    dropped = drop_page_cache()
    rows: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    rates: list[tuple[float, float]] = []
    notes: list[str] = []

    def server(name: str, *extra: str):
        return omlx_server(free_port(), cache, work / f"{name}.log", [*model, *extra])

    with server("first") as s:
        first_s, usage = ttft(s.base_url, text)
        print(f"first turn (computed): {first_s:.1f} s, {usage}", flush=True)
        s.wait_idle()
    for rep in range(args.repeats):
        with server(f"b{rep}") as s:
            wait_prefetch(s.base_url)  # then the turn once (into RAM whatever), then the hit
            ttft(s.base_url, text)
            b, usage_b = ttft(s.base_url, text)
            s.wait_idle()
        drop_page_cache()
        with server(f"a{rep}") as s:
            warm = wait_prefetch(s.base_url)
            a, usage_a = ttft(s.base_url, text)
        drop_page_cache()
        with server(f"c{rep}", "--no-warm-restart") as s:
            c, usage_c = ttft(s.base_url, text)
        files = sorted(cache.glob("*/*/*.safetensors"))
        drop_page_cache()
        cat_s = cat_seconds(files)
        cat_bytes = sum(p.stat().st_size for p in files)
        rate = warm["bytes"] / warm["seconds"] / 1e6 if warm["seconds"] else float("nan")
        rates.append((rate, cat_bytes / cat_s / 1e6))
        for k, v in (("a", a), ("b", b), ("c", c)):
            rows[k].append(v)
        notes.append(f"a: {usage_a['cache']} | b: {usage_b['cache']} | c: {usage_c['cache']}")
        print(
            f"repeat {rep}: (a) {a:.3f} s (b) {b:.3f} s (c) {c:.3f} s; prefetch {warm}; "
            f"cat {cat_bytes / 1e6:.0f} MB in {cat_s:.2f} s",
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in rows.items()}
    prefetch_rate = statistics.median(r for r, _ in rates)
    cat_rate = statistics.median(c for _, c in rates)
    print()
    print(machine_note())
    if not dropped:
        print("page cache NOT dropped (not root): every read rate is a page-cache rate")
    print(
        f"8B geometry ({g.layers} layers, {g.kv_bytes_per_token / 1000:.0f} KB KV/token), "
        f"{usage['prompt_tokens']} prompt tokens, medians of {args.repeats}"
    )
    print(
        table(
            ["turn", "TTFT s", "vs (b)"],
            [
                [
                    "(a) warm restart, prefetch done",
                    f"{med['a']:.3f}",
                    f"{med['a'] / med['b']:.2f}x",
                ],
                ["(b) no restart (RAM hit)", f"{med['b']:.3f}", "1.00x"],
                [
                    "(c) restart, no warm restart (disk)",
                    f"{med['c']:.3f}",
                    f"{med['c'] / med['b']:.2f}x",
                ],
            ],
        )
    )
    print(
        f"prefetch read rate {prefetch_rate:.0f} MB/s; cat {cat_rate:.0f} MB/s "
        f"({prefetch_rate / cat_rate:.2f}x; target >= 0.8x)"
    )
    for line in notes:
        print("  " + line)
    verdicts = [
        f"(a) warm restart TTFT {med['a'] / med['b']:.2f}x the RAM hit (target <= 1.2x)",
        f"prefetch {prefetch_rate / cat_rate:.2f}x cat (target >= 0.8x)",
    ]
    write_json(
        "warm_restart",
        {
            "tokens": usage["prompt_tokens"],
            "layers": g.layers,
            "ttft_s": med,
            "runs": rows,
            "prefetch_mb_s": prefetch_rate,
            "cat_mb_s": cat_rate,
            "page_cache_dropped": dropped,
            "verdicts": verdicts,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
