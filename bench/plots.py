"""PNG plots of the benches' summaries (``summary.summarize`` dicts): bars with min-max
whiskers where there was more than one run.

matplotlib is the optional ``bench`` extra. Without it every function prints one note
and returns None, so a bench still prints its table and writes its JSON.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Summary = Mapping[str, Any] | None

# One colour per peer, the same in every plot.
COLOURS = {
    "omlx": "#1f77b4",
    "mlx_lm.server": "#ff7f0e",
    "mlx_lm": "#ff7f0e",
    "mlx_lm.generate": "#ff7f0e",
    "llama.cpp": "#2ca02c",
}
_FALLBACK = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot():
    if not available():
        print("note: matplotlib is not installed (pip install -e '.[bench]'): no PNG", flush=True)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colour(name: str, i: int) -> str:
    return COLOURS.get(name, _FALLBACK[i % len(_FALLBACK)])


def _whiskers(summaries: Sequence[Summary]) -> tuple[list[float], list[list[float]]]:
    heights, low, high = [], [], []
    for s in summaries:
        if s is None:
            heights.append(0.0)
            low.append(0.0)
            high.append(0.0)
        else:
            heights.append(s["median"])
            low.append(s["median"] - s["min"])
            high.append(s["max"] - s["median"])
    return heights, [low, high]


def _runs(s: Summary) -> int:
    return 0 if s is None else int(s.get("n", len(s.get("values", ())) or 1))


def label_height(s: Summary) -> float:
    """Where a bar's value label sits: over its whisker's top when it has one, so the
    text never crosses the whisker; over the bar itself for a single run."""
    if s is None:
        return 0.0
    return s["max"] if _runs(s) > 1 else s["median"]


def _log_axis(ax, which: str) -> None:
    """A log scale labelled 0.1, 1, 10 and 2, 5 between (not 10^-1 or 2x10^0)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis = ax.yaxis if which == "y" else ax.xaxis
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    plain = FuncFormatter(lambda v, _: f"{v:,.6g}")
    axis.set_major_formatter(plain)
    axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    axis.set_minor_formatter(plain)


def _save(plt, fig, path: Path, note: str | None) -> Path:
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="#555555", ha="left", va="bottom")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", flush=True)
    return path


def grouped_bars(
    path: Path,
    title: str,
    ylabel: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[Summary]],
    *,
    log: bool = False,
    note: str | None = None,
    labels: bool = True,
    overlay: bool = False,
) -> Path | None:
    """One group of bars per category, one bar per series (peer): median, min-max whiskers
    (none for a single run).

    A missing value (None) leaves its bar out. ``labels`` writes each median over its bar
    and whisker.
    ``overlay``: the series fill disjoint categories (one bar per category, coloured by series).
    """
    plt = _pyplot()
    if plt is None:
        return None
    n = 1 if overlay else max(len(series), 1)
    width = 0.8 / n if not overlay else 0.6
    fig, ax = plt.subplots(figsize=(max(9.0, 1.3 * len(categories) + 2), 4.2))
    for i, (name, summaries) in enumerate(series.items()):
        slot = 0 if overlay else i
        xs = [c + (slot - (n - 1) / 2) * width for c in range(len(categories))]
        heights, err = _whiskers(summaries)
        keep = [j for j, s in enumerate(summaries) if s is not None]
        if not keep:
            continue
        ax.bar(
            [xs[j] for j in keep],
            [heights[j] for j in keep],
            width,
            label=name,
            color=_colour(name, i),
        )
        # Whiskers only where there was a spread to show: a single run has none.
        spread = [j for j in keep if _runs(summaries[j]) > 1]
        if spread:
            ax.errorbar(
                [xs[j] for j in spread],
                [heights[j] for j in spread],
                yerr=[[err[0][j] for j in spread], [err[1][j] for j in spread]],
                fmt="none",
                ecolor="#333333",
                elinewidth=1,
                capsize=3,
            )
        if labels:
            for j in keep:
                ax.annotate(
                    f"{heights[j]:.3g}",
                    (xs[j], label_height(summaries[j])),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 3),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        _log_axis(ax, "y")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
    return _save(plt, fig, path, note)


def line_panels(
    path: Path,
    title: str,
    panels: Sequence[Mapping[str, Any]],
    *,
    note: str | None = None,
) -> Path | None:
    """Side-by-side panels of lines with a min-max band.

    Each panel: ``x`` (numbers), ``series`` {name: [Summary per x]}, ``xlabel``, ``ylabel``,
    and optionally ``title``, ``logx``, ``logy``.
    """
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.0), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        xs = list(panel["x"])
        for i, (name, summaries) in enumerate(panel["series"].items()):
            points = [(x, s) for x, s in zip(xs, summaries, strict=True) if s is not None]
            if not points:
                continue
            px = [x for x, _ in points]
            colour = _colour(name, i)
            ax.plot(px, [s["median"] for _, s in points], marker="o", label=name, color=colour)
            ax.fill_between(
                px,
                [s["min"] for _, s in points],
                [s["max"] for _, s in points],
                color=colour,
                alpha=0.2,
            )
        ax.set_xlabel(panel["xlabel"])
        ax.set_ylabel(panel["ylabel"])
        if panel.get("title"):
            ax.set_title(panel["title"], fontsize=9)
        if panel.get("logx"):
            _log_axis(ax, "x")
        if panel.get("logy"):
            _log_axis(ax, "y")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
    return _save(plt, fig, path, note)
