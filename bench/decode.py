"""Decode tokens/s of omlx's engine against mlx_lm.generate on the same loaded model, one run.

    .venv/bin/python bench/decode.py [--model PATH] [--tokens 128] [--rounds 3] [--json OUT]

Both run greedy from the same prompt in the same process, alternating rounds so
machine noise hits both alike; decode rate = tokens after the first / time after the first.
Writes ``bench/out/decode.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots
from common import load_average, machine_note, versions
from summary import fmt_spread, out_path, summarize, write_json

from omlx.adapters.mlx.models.blas import describe_blas, load_optimized_blas

load_optimized_blas()

from mlx_lm.generate import stream_generate  # noqa: E402

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine  # noqa: E402
from omlx.adapters.mlx.models.loader import load_model  # noqa: E402
from omlx.domain.generation import Finished, GenerationRequest, TextDelta  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who collects maps. Use many details."


def mlx_lm_rate(model, prompt: list[int], n: int) -> tuple[float, int]:
    first = last = None
    count = 0
    for response in stream_generate(model.model, model.tokenizer, prompt, max_tokens=n):
        now = time.perf_counter()
        if first is None:
            first = now
        last, count = now, response.generation_tokens
    return (count - 1) / (last - first), count


def omlx_rate(engine: MLXEngine, prompt: list[int], n: int) -> tuple[float, int]:
    stamps: list[float] = []
    done = threading.Event()
    result: list[Finished] = []

    def emit(event) -> None:
        if isinstance(event, TextDelta):
            stamps.append(time.perf_counter())
        elif isinstance(event, Finished):
            stamps.append(time.perf_counter())
            result.append(event)
            done.set()

    engine.submit(GenerationRequest(tuple(prompt), n), emit)
    done.wait()
    tokens = result[0].completion_tokens
    # Text arrives per token (or held for a multi-byte character); time first to finish.
    return (tokens - 1) / (stamps[-1] - stamps[0]), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="mlx-lm folder or .gguf (default: bundled SmolLM2)"
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="default: bench/out/decode.json")
    args = parser.parse_args()

    model = load_model(args.model)
    prompt = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    engine = MLXEngine(model, None, EngineConfig(max_concurrent=1))
    engine.start()
    print(describe_blas())
    print(f"model {model.model_id}, prompt {len(prompt)} tokens, up to {args.tokens} new tokens")
    ours, theirs = [], []
    try:
        mlx_lm_rate(model, prompt, 8)  # warm-up both paths
        omlx_rate(engine, prompt, 8)
        for i in range(args.rounds):
            rate, n = mlx_lm_rate(model, prompt, args.tokens)
            theirs.append(rate)
            print(f"round {i + 1}: mlx_lm.generate {rate:7.1f} tok/s ({n} tokens)")
            rate, n = omlx_rate(engine, prompt, args.tokens)
            ours.append(rate)
            print(f"round {i + 1}: omlx            {rate:7.1f} tok/s ({n} tokens)")
    finally:
        engine.stop()
    o, t = summarize(ours), summarize(theirs)
    r = o["median"] / t["median"]
    verdict = f"decode, one stream: omlx/mlx_lm.generate {r:.2f}x (target >= 1.0x) {'MET' if r >= 1.0 else 'MISSED'}"
    print(
        f"median decode: omlx {fmt_spread(o, 'tok/s', 1)}, mlx_lm.generate {fmt_spread(t, 'tok/s', 1)}\n{verdict}"
    )
    result = {
        "machine": machine_note(),
        "versions": versions(),
        "args": vars(args),
        "load_average": load_average(),
        "prompt_tokens": len(prompt),
        "omlx": o,
        "mlx_lm.generate": t,
        "ratio": r,
        "verdicts": [verdict],
    }
    write_json("decode", result, args.json)
    plots.grouped_bars(
        out_path("decode", ".png"),
        f"Decode, one stream, in one process ({args.tokens} tokens; median of {args.rounds}, whiskers min-max)",
        "tokens/s",
        ["decode"],
        {"omlx": [o], "mlx_lm.generate": [t]},
        note=f"omlx {result['versions']['omlx']}; {result['machine']}",
    )


if __name__ == "__main__":
    main()
