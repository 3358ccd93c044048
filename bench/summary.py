"""Medians, spreads and ratios of repeated measurements, and where a bench writes its results.

Standard library only: the unit tests import it, and a bench works without the ``bench`` extra.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


def summarize(values: Iterable[float | None]) -> dict[str, Any] | None:
    """Median, min and max of the numbers in ``values`` (``None`` and NaN left out); None if none."""
    xs = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return None
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
        "values": xs,
    }


def ratio(a: dict[str, Any] | float | None, b: dict[str, Any] | float | None) -> float | None:
    """``a / b`` of two medians (or plain numbers); None when either is missing or ``b`` is 0."""
    x = a["median"] if isinstance(a, dict) else a
    y = b["median"] if isinstance(b, dict) else b
    if x is None or not y:
        return None
    return x / y


def fmt_spread(s: dict[str, Any] | None, unit: str = "s", digits: int = 3) -> str:
    """``0.412 s (0.398-0.530)``: the median, then min-max when there was more than one value."""
    if s is None:
        return "-"
    sep = " " if unit else ""
    text = f"{s['median']:.{digits}f}{sep}{unit}"
    if s["n"] > 1:
        text += f" ({s['min']:.{digits}f}-{s['max']:.{digits}f})"
    return text


def fmt_x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def interleaved(peers: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(round, peer) in run order: A B C, then C B A, then A B C, ... so drift hits all alike."""
    order: list[tuple[int, str]] = []
    for r in range(repeats):
        names = list(peers) if r % 2 == 0 else list(reversed(peers))
        order.extend((r, name) for name in names)
    return order


def git_sha(root: Path = ROOT) -> str:
    """The checkout's commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def out_path(name: str, suffix: str, out_dir: Path | None = None) -> Path:
    """``bench/out/<name><suffix>`` (or ``$BENCH_OUT``), the folder made on demand."""
    folder = out_dir or Path(os.environ.get("BENCH_OUT", OUT))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}{suffix}"


def write_json(name: str, result: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``result`` with the bench's name and the git sha, to ``path`` or ``bench/out``."""
    result.setdefault("bench", name)
    result.setdefault("git_sha", git_sha())
    target = path or out_path(name, ".json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {target}", flush=True)
    return target
