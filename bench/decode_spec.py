"""Decode tokens/s with speculative decoding (prompt lookup) against omlx without it,
mlx_lm.generate and llama.cpp's own prompt lookup, on copy-heavy and free text, one run.

    .venv/bin/python bench/decode_spec.py [--tokens 200] [--rounds 3] [--no-llama-cpp] [--json OUT]

Cases (greedy, the default model, chat template applied):
- ``edit_call``: a ~2k-token source file, then "rewrite function X with a local renamed":
  the answer repeats a region of the file with small changes (an agent's Edit call);
- ``code_echo``: the same file, "repeat function Y exactly, in a code block";
- ``free_text`` and ``explain``: prose that repeats little of its prompt.

omlx runs in this process, on one loaded model, twice over: an engine that speculates
and one that does not (``--no-speculation``); mlx_lm.generate (``stream_generate``, the
decode loop ``mlx_lm.server`` runs; its own speculation needs a smaller draft model of the
same tokenizer, which the 135M default model does not have) runs on the same model object.
llama.cpp (llama-cpp-python's server on the same GGUF, built by
scripts/install-llama-cpp.sh) runs plain and with ``--draft_model prompt-lookup-decoding``.
Rounds interleave every peer on every case, so machine noise hits all alike; decode rate
= (tokens - 1) / (time from the first token to the last). The greedy texts of omlx with
and without speculation must be identical. Writes ``bench/out/decode_spec.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import textwrap
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots
from common import (
    default_gguf,
    free_port,
    llama_cpp_python,
    llama_cpp_server,
    load_average,
    machine_note,
    stream_chat,
    versions,
)
from summary import OUT, fmt_spread, out_path, summarize, write_json

from omlx.adapters.mlx.models.blas import describe_blas, load_optimized_blas

load_optimized_blas()

from mlx_lm.generate import stream_generate  # noqa: E402

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine  # noqa: E402
from omlx.adapters.mlx.models.loader import load_model  # noqa: E402
from omlx.domain.generation import Finished, GenerationRequest, TextDelta  # noqa: E402
from omlx.domain.speculation import SpeculationConfig  # noqa: E402


def source_file() -> str:
    """~2k tokens of real Python: the end of the standard library's textwrap module."""
    source = inspect.getsource(textwrap)
    return source[source.index("    def _split_chunks") :]


def cases() -> dict[str, str]:
    code = f"File textwrap.py:\n```python\n{source_file()}\n```\n"
    return {
        "edit_call": code + "Rename the local variable `margin` to `common` in `dedent`. "
        "Reply with the whole rewritten function in a code block.",
        "code_echo": code
        + "Repeat the function `fill` from the file above, exactly, in a code block.",
        "free_text": "Write a long story about a lighthouse keeper who collects maps. Use many details.",
        "explain": "Explain to a ten-year-old how a refrigerator keeps food cold, step by step.",
    }


COPYING = ("edit_call", "code_echo")


def omlx_run(engine: MLXEngine, prompt: list[int], n: int) -> tuple[float, str, Finished]:
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

    engine.submit(GenerationRequest(tuple(prompt), n), emit)
    done.wait()
    finished = result[0]
    return (finished.completion_tokens - 1) / (stamps[-1] - stamps[0]), "".join(text), finished


def omlx_pair(engine: MLXEngine, prompts: list[list[int]], n: int) -> float:
    """Two requests decoding together: tokens of both per second, from the moment both
    are out (their prefills not counted) until the first of them ends."""
    stamps: list[list[float]] = [[] for _ in prompts]
    ended: list[float] = []
    left = threading.Semaphore(0)
    lock = threading.Lock()

    def emitter(i: int):
        def emit(event) -> None:
            with lock:
                if isinstance(event, TextDelta):
                    stamps[i].append(time.perf_counter())
                elif isinstance(event, Finished):
                    ended.append(time.perf_counter())
                    left.release()

        return emit

    for i, prompt in enumerate(prompts):
        engine.submit(GenerationRequest(tuple(prompt), n), emitter(i))
    for _ in prompts:
        left.acquire()
    start, end = max(s[0] for s in stamps), min(ended)
    together = sum(1 for s in stamps for t in s if start < t <= end)
    return together / (end - start)


def mlx_lm_run(model, prompt: list[int], n: int) -> tuple[float, str]:
    first = last = None
    count = 0
    pieces = []
    for response in stream_generate(model.model, model.tokenizer, prompt, max_tokens=n):
        now = time.perf_counter()
        if first is None:
            first = now
        last, count = now, response.generation_tokens
        pieces.append(response.text)
    return (count - 1) / (last - first), "".join(pieces)


def llama_run(server, tokenizer, messages, n: int) -> float:
    r = stream_chat(server.base_url, "smollm2", messages, n)
    tokens = r.completion_tokens or len(tokenizer.encode(r.text, add_special_tokens=False))
    return (tokens - 1) / max(r.total - r.ttft, 1e-9)


def batched_rates(model, prompts: dict[str, list[int]], args) -> dict[str, dict]:
    """Two streams (one copying, one not) decoding together, three ways, interleaved."""
    pair = [prompts.get("code_echo"), prompts.get("explain")]
    if None in pair:
        return {}
    engines = {
        "max_rows 1 (default)": SpeculationConfig(max_rows=1),
        "max_rows 2": SpeculationConfig(max_rows=2),
        "--no-speculation": None,
    }
    started = {
        k: MLXEngine(model, None, EngineConfig(max_concurrent=2, speculation=c))
        for k, c in engines.items()
    }
    rates: dict[str, list[float]] = {k: [] for k in engines}
    try:
        for engine in started.values():
            engine.start()
            omlx_pair(engine, pair, 8)
        for i in range(args.rounds):
            for name, engine in started.items():
                rates[name].append(omlx_pair(engine, pair, args.tokens))
            print(
                f"round {i + 1} two streams tok/s: "
                + "  ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()),
                flush=True,
            )
    finally:
        for engine in started.values():
            engine.stop()
    out = {k: summarize(v) for k, v in rates.items()}
    print("two streams: " + ", ".join(f"{k} {fmt_spread(v, 'tok/s', 1)}" for k, v in out.items()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(cases()), help="comma-separated subset")
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even if built")
    parser.add_argument(
        "--batched",
        action="store_true",
        help="also two streams at once (code_echo beside explain): speculation_max_rows 1 and 2, and off",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="default: bench/out/decode_spec.json"
    )
    args = parser.parse_args()

    model = load_model(None)
    tok = model.tokenizer
    chosen = {k: v for k, v in cases().items() if k in args.cases.split(",")}
    messages = {k: [{"role": "user", "content": v}] for k, v in chosen.items()}
    prompts = {
        k: tok.apply_chat_template(m, add_generation_prompt=True) for k, m in messages.items()
    }
    spec = MLXEngine(model, None, EngineConfig(max_concurrent=1, speculation=SpeculationConfig()))
    plain = MLXEngine(model, None, EngineConfig(max_concurrent=1))
    spec.start()
    plain.start()
    llamas = {}
    if not args.no_llama_cpp and llama_cpp_python() is not None:
        work = OUT / "decode_spec-llama"
        llamas = {
            "llama.cpp": llama_cpp_server(
                free_port(), default_gguf(), work / "plain.log", work / "plain"
            ),
            "llama.cpp lookup": llama_cpp_server(
                free_port(),
                default_gguf(),
                work / "lookup.log",
                work / "lookup",
                ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "10"],
            ),
        }
        for server in llamas.values():
            server.start()
    elif not args.no_llama_cpp:
        print("note: llama.cpp not built (scripts/install-llama-cpp.sh): its columns are left out")
    print(describe_blas())
    print(
        f"model {model.model_id}; prompts: "
        + ", ".join(f"{k} {len(p)} tokens" for k, p in prompts.items())
    )
    peers = ["omlx", "omlx --no-speculation", "mlx_lm.generate", *llamas]
    rates: dict[str, dict[str, list[float]]] = {c: {p: [] for p in peers} for c in prompts}
    texts: dict[str, dict[str, set[str]]] = {c: {"spec": set(), "plain": set()} for c in prompts}
    acceptance: dict[str, list[float]] = {c: [] for c in prompts}
    try:
        first = next(iter(prompts.values()))
        omlx_run(spec, first, 8)  # warm-up every path
        omlx_run(plain, first, 8)
        mlx_lm_run(model, first, 8)
        for i in range(args.rounds):
            for case, prompt in prompts.items():
                rate, text, _ = omlx_run(plain, prompt, args.tokens)
                rates[case]["omlx --no-speculation"].append(rate)
                texts[case]["plain"].add(text)
                rate, text, finished = omlx_run(spec, prompt, args.tokens)
                rates[case]["omlx"].append(rate)
                texts[case]["spec"].add(text)
                s = finished.speculation
                acceptance[case].append(s.accepted / s.drafted if s and s.drafted else 0.0)
                rates[case]["mlx_lm.generate"].append(mlx_lm_run(model, prompt, args.tokens)[0])
                for name, server in llamas.items():
                    rates[case][name].append(llama_run(server, tok, messages[case], args.tokens))
                line = "  ".join(f"{p} {rates[case][p][-1]:6.1f}" for p in peers)
                print(
                    f"round {i + 1} {case:10} tok/s: {line}  (drafts accepted {acceptance[case][-1]:.0%})",
                    flush=True,
                )
        batched = batched_rates(model, prompts, args) if args.batched else {}
    finally:
        spec.stop()
        plain.stop()
        for server in llamas.values():
            server.stop()
    summaries = {c: {p: summarize(v) for p, v in rates[c].items()} for c in prompts}
    verdicts = []
    for case in prompts:
        s = summaries[case]
        vs_plain = s["omlx"]["median"] / s["omlx --no-speculation"]["median"]
        vs_mlx = s["omlx"]["median"] / s["mlx_lm.generate"]["median"]
        same = texts[case]["spec"] == texts[case]["plain"] and len(texts[case]["spec"]) == 1
        if case in COPYING:
            met = vs_plain >= 2.0 and vs_mlx >= 1.5
            target = "targets >= 2x --no-speculation, >= 1.5x mlx_lm"
        else:
            met = vs_plain >= 0.95
            target = "target >= 0.95x --no-speculation"
        verdicts.append(
            f"{case}: omlx {vs_plain:.2f}x --no-speculation, {vs_mlx:.2f}x mlx_lm.generate ({target}) "
            f"{'MET' if met else 'MISSED'}; greedy text identical: {'yes' if same else 'NO'}"
        )
        print(f"{case}: " + ", ".join(f"{p} {fmt_spread(s[p], 'tok/s', 1)}" for p in peers))
    print("\n".join(verdicts))
    result = {
        "machine": machine_note(),
        "versions": versions(),
        "args": vars(args),
        "load_average": load_average(),
        "prompt_tokens": {c: len(p) for c, p in prompts.items()},
        "rates": summaries,
        "acceptance": {c: summarize(v) for c, v in acceptance.items()},
        "identical": {c: texts[c]["spec"] == texts[c]["plain"] for c in prompts},
        "two_streams": batched,
        "verdicts": verdicts,
    }
    write_json("decode_spec", result, args.json)
    plots.grouped_bars(
        out_path("decode_spec", ".png"),
        f"Decode with speculation, one stream ({args.tokens} tokens; median of {args.rounds}, whiskers min-max)",
        "tokens/s",
        list(prompts),
        {p: [summaries[c][p] for c in prompts] for p in peers},
        note=f"omlx {result['versions']['omlx']}; {result['machine']}",
    )


if __name__ == "__main__":
    main()
