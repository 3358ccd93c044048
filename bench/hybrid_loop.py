"""Hybrid and sliding-window models in an agent loop: what the cache restores, against --no-cache.

    .venv/bin/python bench/hybrid_loop.py [--families qwen3_next gemma3_text falcon_h1]

For each family a random-weight model of its layout (``tests/hybrid_models.py``, made
deeper here so prefill costs time) serves a conversation: a ~2,000-token system prompt,
three turns, then a full restart and the last turn replayed. The same conversation runs
on the same model with ``--no-cache`` (histories from the cached run, so the prompts are
the same bytes). Per turn: prompt tokens, cached tokens, TTFT of both; per request, the
bytes of restore-point objects (state snapshots, window KV) the cache kept. Writes
``bench/out/hybrid_loop.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import plots
from common import (
    ROOT,
    free_port,
    load_average,
    machine_note,
    omlx_server,
    stream_chat,
    table,
    versions,
)
from summary import out_path, summarize, write_json

from tests.hybrid_models import build_hybrid_model

WORK = Path("/tmp/omlx-bench/hybrid")
DEEPER = {"hidden_size": 256, "intermediate_size": 512}
LAYERS = {"qwen3_next": 8, "gemma3_text": 8, "falcon_h1": 4}
TURNS = ["What does the cache keep?", "And what happens after a restart?", "How is it inspected?"]


def system_prompt(chars: int) -> str:
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "api.md").read_text()
    return text[:chars]


def metric(base_url: str, name: str) -> float:
    """A counter's value summed over its labels (``name{model="..."} value`` or ``name value``)."""
    total = 0.0
    for line in httpx.get(base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith((name + " ", name + "{")):
            total += float(line.rsplit(None, 1)[1])
    return total


def conversation(base_url: str, model: str, system: str, replies: list[str] | None = None):
    messages = [{"role": "system", "content": system}]
    out = []
    for i, user in enumerate(TURNS):
        messages.append({"role": "user", "content": user})
        r = stream_chat(base_url, model, messages, max_tokens=12)
        out.append(r)
        messages.append({"role": "assistant", "content": replies[i] if replies else r.text})
    return out, messages


def run_family(family: str, chars: int) -> dict:
    model_dir = WORK / "models" / family
    if not (model_dir / "config.json").exists():
        overrides = dict(DEEPER, num_hidden_layers=LAYERS[family])
        if family == "falcon_h1":
            overrides.update(mamba_d_ssm=256, mamba_n_heads=8, mamba_d_head=32)
        build_hybrid_model(family, model_dir, **overrides)
    system = system_prompt(chars)
    cache = WORK / family / "cache"
    shutil.rmtree(WORK / family, ignore_errors=True)
    args = ["--model", str(model_dir), "--block-size", "64"]
    with omlx_server(free_port(), cache, WORK / family / "omlx.log", args) as s:
        cached, history = conversation(s.base_url, family, system)
        object_bytes = metric(s.base_url, "omlx_cache_restore_object_bytes_total")
        requests = len(cached)
    replies = [r.text for r in cached]
    with omlx_server(free_port(), cache, WORK / family / "omlx.log", args) as s:  # restarted
        replay = stream_chat(s.base_url, family, history[:-1], max_tokens=12)
    plain_dir = WORK / family / "plain"
    with omlx_server(
        free_port(), plain_dir, WORK / family / "plain.log", [*args, "--no-cache"]
    ) as s:
        plain, _ = conversation(s.base_url, family, system, replies)
    return {
        "family": family,
        "turns": [
            {
                "prompt": c.prompt_tokens,
                "cached": c.cached_tokens,
                "ttft_s": c.ttft,
                "no_cache_ttft_s": p.ttft,
                "same_text": c.text == p.text,
            }
            for c, p in zip(cached, plain, strict=True)
        ],
        "restart_replay": {
            "prompt": replay.prompt_tokens,
            "cached": replay.cached_tokens,
            "ttft_s": replay.ttft,
            "no_cache_ttft_s": plain[-1].ttft,
            "same_text": replay.text == plain[-1].text,
        },
        "restore_object_bytes_per_request": object_bytes / requests,
    }


def report(result: dict) -> None:
    print(f"machine: {result['machine']}; load {result['load_before']} -> {result['load_after']}")
    rows = []
    for fam in result["families"]:
        prev = None
        for i, t in enumerate(fam["turns"], 1):
            share = f"{100 * t['cached'] / prev:.0f}% of the previous prompt" if prev else "-"
            rows.append(
                [
                    fam["family"],
                    f"turn {i}",
                    t["prompt"],
                    t["cached"],
                    share,
                    f"{t['ttft_s']:.3f}",
                    f"{t['no_cache_ttft_s']:.3f}",
                    t["same_text"],
                ]
            )
            prev = t["prompt"]
        r = fam["restart_replay"]
        rows.append(
            [
                fam["family"],
                "after restart",
                r["prompt"],
                r["cached"],
                f"{100 * r['cached'] / r['prompt']:.0f}% of the prompt",
                f"{r['ttft_s']:.3f}",
                f"{r['no_cache_ttft_s']:.3f}",
                r["same_text"],
            ]
        )
    print(
        table(
            [
                "model",
                "turn",
                "prompt",
                "cached",
                "cached share",
                "TTFT s",
                "--no-cache TTFT s",
                "same text",
            ],
            rows,
        )
    )
    for fam in result["families"]:
        print(
            f"{fam['family']}: {fam['restore_object_bytes_per_request'] / 1e3:.0f} kB of restore-point objects per request"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["qwen3_next", "gemma3_text", "falcon_h1"])
    parser.add_argument(
        "--chars", type=int, default=2400, help="~2,000 tokens of the tiny tokenizer"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="default: bench/out/hybrid_loop.json"
    )
    args = parser.parse_args()
    result = {"machine": machine_note(), "versions": versions(), "load_before": load_average()}
    result["families"] = [run_family(f, args.chars) for f in args.families]
    result["load_after"] = load_average()
    report(result)
    write_json("hybrid_loop", result, args.json)
    plot(result)


def plot(result: dict) -> None:
    cats, cached, plain = [], [], []
    for fam in result["families"]:
        steps = [*fam["turns"], fam["restart_replay"]]
        for i, t in enumerate(steps, 1):
            restart = i == len(steps)
            cats.append(f"{fam['family']}\n{'restart' if restart else f'turn {i}'}")
            cached.append(summarize([t["ttft_s"]]))
            # The restart replays turn 3's prompt and has no --no-cache run of its own:
            # drawing turn 3's number again would pass it off as a second measurement.
            plain.append(None if restart else summarize([t["no_cache_ttft_s"]]))
    plots.grouped_bars(
        out_path("hybrid_loop", ".png"),
        "Hybrid and sliding-window models (random weights, ~2,000-token prompt): TTFT, one run",
        "seconds",
        cats,
        {"omlx": cached, "omlx --no-cache": plain},
        note=(
            f"omlx {result['versions']['omlx']}; {result['machine']}; restart: the replay's own TTFT "
            "(its --no-cache counterpart is turn 3's bar)"
        ),
    )


if __name__ == "__main__":
    main()
