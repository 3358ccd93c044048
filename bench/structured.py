"""Decode tokens/s of a JSON-schema request against a free one, and grammar compile times.

    .venv/bin/python bench/structured.py [--model PATH] [--tokens 128] [--rounds 3]

One stream, greedy, the same prompt, in one process through omlx's engine; rounds
alternate so machine noise hits both alike. Decode rate = tokens after the first / time
after the first. The schema asks for a long array, so the constrained answer runs to
``--tokens`` like the free one. Compile times are for grammars not yet cached (each one
made unique), then a cached lookup; the grammar's own work per step is timed inside the engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from omlx.adapters.mlx.models.blas import describe_blas, load_optimized_blas

load_optimized_blas()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_average  # noqa: E402

from omlx.adapters.grammar import Constraint, LLGuidanceCompiler  # noqa: E402
from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine  # noqa: E402
from omlx.adapters.mlx.models.loader import load_model  # noqa: E402
from omlx.app.chat.tool_calls import HERMES  # noqa: E402
from omlx.domain.generation import Finished, GenerationRequest, TextDelta  # noqa: E402
from omlx.domain.grammar import CallShape, OutputGrammar  # noqa: E402

PROMPT = "List many short facts about lighthouses, as JSON."
LONG = {
    "type": "object",
    "properties": {
        "facts": {"type": "array", "items": {"type": "string", "maxLength": 60}, "minItems": 200}
    },
    "required": ["facts"],
    "additionalProperties": False,
}
PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "role", "address", "tags"],
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string"}},
    },
}


def rate(engine: MLXEngine, request: GenerationRequest) -> tuple[float, int, str]:
    stamps: list[float] = []
    text: list[str] = []
    done = threading.Event()
    result: list[Finished] = []

    def emit(event) -> None:
        if isinstance(event, TextDelta):
            stamps.append(time.perf_counter())
            text.append(event.text)
        elif isinstance(event, Finished):
            stamps.append(time.perf_counter())
            result.append(event)
            done.set()

    engine.submit(request, emit)
    done.wait()
    tokens = result[0].completion_tokens
    return (tokens - 1) / (stamps[-1] - stamps[0]), tokens, "".join(text)


class GrammarTimer:
    """Times the grammar's own work per step (taking the token, computing the mask),
    without the wait for the step's forward pass that the token read includes."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        timer = self
        fill, advance = Constraint.fill_bitmask, Constraint.advance

        def timed_fill(constraint, out):
            started = time.perf_counter()
            fill(constraint, out)
            timer.seconds.append(time.perf_counter() - started)

        def timed_advance(constraint, token):
            started = time.perf_counter()
            ok = advance(constraint, token)
            timer.seconds.append(time.perf_counter() - started)
            return ok

        Constraint.fill_bitmask, Constraint.advance = timed_fill, timed_advance


def compile_times(grammars: LLGuidanceCompiler) -> list[tuple[str, float, float]]:
    """(what, first compile ms, cached lookup ms), each grammar made unique to miss the cache."""
    tag = str(time.time_ns())
    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    cases = {
        "json_object": OutputGrammar(json_schema=json.dumps({"type": "object", "$comment": tag})),
        "person schema (nested, enum, array)": OutputGrammar(
            json_schema=json.dumps({**PERSON, "$comment": tag})
        ),
        "forced call, 2 tools, <tool_call> markers": OutputGrammar(
            calls=tuple(
                CallShape(
                    name, HERMES.before(name), json.dumps({**schema, "$comment": tag}), HERMES.after
                )
                for name, schema in (("get_weather", weather), ("get_time", {"type": "object"}))
            ),
            between=HERMES.between,
            several_calls=True,
        ),
    }
    out = []
    for what, grammar in cases.items():
        started = time.perf_counter()
        grammars.constraint(grammar)
        first = time.perf_counter() - started
        started = time.perf_counter()
        grammars.constraint(grammar)
        out.append((what, first * 1e3, (time.perf_counter() - started) * 1e3))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="mlx-lm folder or .gguf (default: bundled SmolLM2)"
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    model = load_model(args.model)
    eos = sorted(model.tokenizer.eos_token_ids)
    started = time.perf_counter()
    grammars = LLGuidanceCompiler(model.tokenizer, eos, model.config.get("vocab_size"))
    grammars.tokenizer  # noqa: B018 - waits for the vocabulary view
    built = time.perf_counter() - started
    prompt = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    long = OutputGrammar(json_schema=json.dumps(LONG))
    engine = MLXEngine(model, None, EngineConfig(max_concurrent=1))
    engine.start()
    timer = GrammarTimer()
    print(describe_blas())
    print(f"load average at start: {load_average()}")
    print(f"model {model.model_id}, prompt {len(prompt)} tokens, up to {args.tokens} new tokens")
    print(f"llguidance vocabulary view: {built * 1e3:.0f} ms (once per model, in the background)")
    for what, first, cached in compile_times(grammars):
        print(f"compile {what}: {first:.1f} ms, cached {cached:.3f} ms")

    def free() -> GenerationRequest:
        return GenerationRequest(tuple(prompt), args.tokens)

    def constrained() -> GenerationRequest:
        return GenerationRequest(tuple(prompt), args.tokens, constraint=grammars.constraint(long))

    free_rates, json_rates = [], []
    try:
        rate(engine, GenerationRequest(tuple(prompt), 8))  # warm-up both paths
        rate(engine, GenerationRequest(tuple(prompt), 8, constraint=grammars.constraint(long)))
        timer.seconds.clear()
        for i in range(args.rounds):
            r, n, _ = rate(engine, free())
            free_rates.append(r)
            print(f"round {i + 1}: free        {r:7.1f} tok/s ({n} tokens)")
            r, n, text = rate(engine, constrained())
            json_rates.append(r)
            print(f"round {i + 1}: json schema {r:7.1f} tok/s ({n} tokens) {text[:60]!r}")
    finally:
        engine.stop()
    work = sorted(timer.seconds)
    p50 = work[len(work) // 2] * 1e3
    p99 = work[min(len(work) - 1, int(len(work) * 0.99))] * 1e3
    print(f"grammar work per call (advance or mask): median {p50:.3f} ms, p99 {p99:.3f} ms")
    print(f"load average at end: {load_average()}")
    f, j = statistics.median(free_rates), statistics.median(json_rates)
    print(
        f"median decode: json schema {j:.1f} tok/s, free {f:.1f} tok/s, ratio {j / f:.2f}x (target >= 0.8x)"
    )


if __name__ == "__main__":
    main()
