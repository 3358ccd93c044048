"""What ``omlx serve`` imports between its spawn and ``ready``: ``python -X importtime``.

    .venv/bin/python bench/import_time.py [--src OTHER_CHECKOUT/src] [--repeats 3]

Spawns ``omlx serve`` on the default model with ``-X importtime``, waits for /health to say
ready, stops it, and sums the cumulative import time of every top-level import (all
threads), lists the largest and says whether ``transformers`` was imported. ``--src`` runs
another checkout's sources (``PYTHONPATH``): the same numbers before a change.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port
from summary import write_json

LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def one_start(src: Path | None, cache: Path) -> tuple[float, dict[str, float], bool, float]:
    """Seconds of imports (sum of top-level cumulative), the top-level ones, transformers?,
    and spawn -> ready."""
    port = free_port()
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    err_path = cache.parent / "serve.err"  # a file: a pipe left unread fills and stalls the server
    cache.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    err_file = open(err_path, "w")  # noqa: SIM115 (closed below, after the process ends)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "omlx",
            "serve",
            "--port",
            str(port),
            "--paged-ssd-cache-dir",
            str(cache),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err_file,
    )
    ready = None
    try:
        while ready is None and time.perf_counter() - t0 < 300:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json().get("ready"):
                    ready = time.perf_counter() - t0
            except (httpx.HTTPError, ValueError):
                time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        err_file.close()
    err = err_path.read_text(errors="replace")
    top: dict[str, float] = {}
    names = set()
    for m in LINE.finditer(err):
        names.add(m.group(4))
        if len(m.group(3)) == 1:  # a top-level import: its cumulative time covers its children
            top[m.group(4)] = top.get(m.group(4), 0.0) + int(m.group(2)) / 1e6
    return sum(top.values()), top, "transformers" in names, ready or float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="omlx-importtime-") as tmp:
        cache = Path(tmp) / "cache"
        one_start(args.src, cache)  # the first start writes the prepared weights copy
        time.sleep(3)
        runs = [one_start(args.src, cache) for _ in range(args.repeats)]
    totals = [r[0] for r in runs]
    readies = [r[3] for r in runs]
    last = runs[-1][1]
    print(f"source: {args.src or 'this checkout'}")
    print(
        f"imports up to ready: {statistics.median(totals):.2f} s (median of {args.repeats}; "
        f"-X importtime's own overhead included); spawn -> ready {statistics.median(readies):.2f} s"
    )
    print(f"transformers imported: {runs[-1][2]}")
    largest = sorted(last.items(), key=lambda kv: -kv[1])[:10]
    for name, seconds in largest:
        print(f"  {seconds:6.3f} s  {name}")
    verdict = "transformers not imported: met" if not runs[-1][2] else "transformers imported"
    write_json(
        "import_time",
        {
            "source": str(args.src or "."),
            "imports_s": statistics.median(totals),
            "ready_s": statistics.median(readies),
            "transformers": runs[-1][2],
            "largest": dict(largest),
            "verdicts": [verdict],
        },
    )


if __name__ == "__main__":
    main()
