"""Run the benchmark set one bench at a time (``make bench``); ``--quick`` for a short pass.

    .venv/bin/python bench/run_all.py [--quick] [--only agent_loop,restore] [--copy-plots DIR]

Each bench prints its table and writes ``bench/out/<name>.json`` and ``.png``; its output
also goes to ``bench/out/<name>.log``. A bench that fails does not stop the others; the
exit status says whether all passed. ``BENCH_QUICK=1`` is the same as ``--quick``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from summary import OUT, ROOT, git_sha

# name: (full arguments, --quick arguments)
SET: dict[str, tuple[list[str], list[str]]] = {
    "agent_loop": ([], ["--repeats", "1", "--turns", "3", "--context-tokens", "1000"]),
    "concurrency": (
        ["--streams", "1,4", "--reps", "3"],
        ["--streams", "1,4", "--reps", "1", "--tokens", "64"],
    ),
    "decode": ([], ["--rounds", "1", "--tokens", "64"]),
    "decode_spec": (["--tokens", "160", "--batched"], ["--rounds", "1", "--tokens", "96"]),
    "restore": ([], ["--rounds", "1", "--tokens", "1024"]),
    "object_store": ([], ["--rounds", "1", "--tokens", "1024"]),
    "index_scale": ([], ["--rows", "10000,100000", "--reps", "50", "--no-orphans"]),
    "hybrid_loop": ([], ["--families", "gemma3_text"]),
    "agent_trace": ([], ["--models", "long", "--scale", "long=0.1", "--main-turns", "10"]),
    "vision": ([], ["--repeats", "1", "--system-tokens", "600"]),
    "warm_restart": ([], ["--repeats", "1", "--tokens", "2048"]),
    "morning_after": ([], ["--repeats", "1", "--context-tokens", "2000"]),
    "import_time": ([], ["--repeats", "1"]),
    "affinity": ([], ["--sessions", "3", "--turns", "3", "--context-tokens", "700"]),
    "trace_replay": (
        ["--scale", "0.1"],
        ["--scale", "0.05", "--only", "trace_0012,trace_0019,trace_0291"],
    ),
    # The same bench at the recorded sizes: two traces to the set's median end context.
    "trace_replay_long": (
        ["--modes", "sequential", "--only", "trace_0146,trace_0404", "--max-context", "115200"],
        ["--modes", "sequential", "--only", "trace_0146", "--scale", "0.1"],
    ),
}
# Entries that run another entry's script with other arguments (and their own JSON).
SCRIPT = {"trace_replay_long": "trace_replay"}


def run_one(name: str, args: list[str]) -> dict:
    argv = [sys.executable, str(ROOT / "bench" / f"{SCRIPT.get(name, name)}.py"), *args]
    if name in SCRIPT:
        argv += ["--json", str(OUT / f"{name}.json")]
    print(f"\n=== {name}: {' '.join(argv[1:])}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    for stale in (OUT / f"{name}.json", OUT / f"{name}.png"):
        stale.unlink(missing_ok=True)  # a failed run must not show the last run's results
    t0 = time.perf_counter()
    with open(OUT / f"{name}.log", "w") as log:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        code = proc.wait()
    wall = time.perf_counter() - t0
    verdicts = []
    with contextlib.suppress(OSError, ValueError):
        verdicts = json.loads((OUT / f"{name}.json").read_text()).get("verdicts", [])
    print(f"=== {name}: exit {code} in {wall:.0f} s", flush=True)
    return {
        "bench": name,
        "argv": argv[1:],
        "exit": code,
        "wall_s": round(wall, 1),
        "verdicts": verdicts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", default=os.environ.get("BENCH_QUICK") == "1"
    )
    parser.add_argument("--only", default="", help=f"comma-separated subset of {', '.join(SET)}")
    parser.add_argument(
        "--copy-plots", type=Path, default=None, help="copy the PNGs here (docs/img/bench)"
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(SET)
    unknown = [n for n in names if n not in SET]
    if unknown:
        parser.error(f"unknown bench {unknown}; the set: {', '.join(SET)}")
    t0 = time.perf_counter()
    runs = [run_one(n, SET[n][1] if args.quick else SET[n][0]) for n in names]
    total = time.perf_counter() - t0
    summary = {"git_sha": git_sha(), "quick": args.quick, "wall_s": round(total, 1), "runs": runs}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"\n=== the set ({'quick' if args.quick else 'full'}), omlx {summary['git_sha']}: {total / 60:.1f} min"
    )
    for r in runs:
        print(f"{r['bench']:12} exit {r['exit']}  {r['wall_s']:7.0f} s")
        for v in r["verdicts"]:
            print(f"    {v}")
    if args.copy_plots:
        args.copy_plots.mkdir(parents=True, exist_ok=True)
        for n in names:
            png = OUT / f"{n}.png"
            if png.exists():
                shutil.copy(png, args.copy_plots / png.name)
        print(f"copied the plots to {args.copy_plots}")
    sys.exit(1 if any(r["exit"] for r in runs) else 0)


if __name__ == "__main__":
    main()
