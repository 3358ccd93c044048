"""Decode tokens/s of omlx's engine against mlx_lm.generate on the same loaded model, one run.

    .venv/bin/python bench/decode.py [--model PATH] [--tokens 128] [--rounds 3]

Both run greedy from the same prompt in the same process, alternating rounds so
machine noise hits both alike; decode rate = tokens after the first / time after the first.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from omlx.adapters.mlx.blas import describe_blas, load_optimized_blas

load_optimized_blas()

from mlx_lm.generate import stream_generate  # noqa: E402

from omlx.adapters.mlx.engine import EngineConfig, MLXEngine  # noqa: E402
from omlx.adapters.mlx.loader import load_model  # noqa: E402
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
    parser.add_argument("--model", default=None, help="mlx-lm folder or .gguf (default: bundled SmolLM2)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    model = load_model(args.model)
    prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
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
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"median decode: omlx {o:.1f} tok/s, mlx_lm.generate {t:.1f} tok/s, ratio {o / t:.2f}x (target >= 0.95x)")


if __name__ == "__main__":
    main()
