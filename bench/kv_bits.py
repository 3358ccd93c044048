"""What ``--kv-bits`` costs and saves on the default model, in one process (docs/benchmarks.md).

Per setting (off, 8, 4): bytes per token of a stored block, the restore of a prefix from
block files (decode + assemble), perplexity over CPython standard-library source with the
prefix restored from blocks, and greedy agreement over 200 tokens with the unquantized run.
Also the attention-only decode cost of mlx-lm's quantized SDPA against plain SDPA, which
decides whether the running cache itself should be quantized on this machine.

``--running`` measures the running (batched) cache per ``kv_mode`` instead (off, store-8,
exact-8, exact-4): its bytes per token in RAM, prefill tok/s and decode ms/step at
``--context`` tokens, greedy agreement with off, and whether a hit (blocks cut from the
running cache, through block-file bytes, restored) decodes the miss's greedy tokens.

    PYTHONPATH=src python bench/kv_bits.py [--context 2048] [--out FILE.json]
    PYTHONPATH=src python bench/kv_bits.py --running [--modes off,exact-8] [--context 2048]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from omlx.adapters.mlx.models.blas import load_optimized_blas

load_optimized_blas()

import mlx.core as mx  # noqa: E402
from mlx_lm.models.base import (  # noqa: E402
    quantized_scaled_dot_product_attention,
    scaled_dot_product_attention,
)
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from omlx.adapters.mlx.cache.codec import MLXKVCodec  # noqa: E402
from omlx.adapters.mlx.cache.exact import exact_prompt_cache  # noqa: E402
from omlx.adapters.mlx.mlx_lm_private.rows import RowView  # noqa: E402
from omlx.adapters.mlx.models.loader import load_model  # noqa: E402
from omlx.domain.cache.blocks import BlockMeta  # noqa: E402
from omlx.domain.cache.keys import block_key  # noqa: E402
from omlx.domain.cache.kv_quant import KVQuant  # noqa: E402

SETTINGS = {"off": None, "8": KVQuant(8, 64), "4": KVQuant(4, 64)}
MODES = {
    "off": None,
    "store-8": KVQuant(8, 64),
    "exact-8": KVQuant(8, 64, "exact"),
    "exact-4": KVQuant(4, 64, "exact"),
}
BLOCK = 64


def corpus_tokens(tokenizer, n: int) -> list[int]:
    """``n`` tokens of CPython's own sources (the same files on every Python 3.11)."""
    stdlib = Path(json.__file__).resolve().parents[1]
    text = "".join(
        (stdlib / name).read_text() for name in ("textwrap.py", "shlex.py", "fnmatch.py")
    )
    return list(tokenizer.encode(text))[:n]


def prefill(model, tokens: list[int], step: int = 512):
    cache = make_prompt_cache(model.model)
    logits = None
    for start in range(0, len(tokens), step):
        logits = model.model(mx.array(tokens[start : start + step])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache, logits


def block_files(codec: MLXKVCodec, cache, tokens: list[int]) -> list[bytes]:
    files, parent = [], "00" * 32
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        block = tokens[start : start + BLOCK]
        key = block_key(parent, block)
        payload = codec.split(cache, start, start + BLOCK)
        files.append(bytes(codec.encode(payload, block, BlockMeta(key, parent, "11" * 32, BLOCK))))
        parent = key
    return files


def restore(codec: MLXKVCodec, files: list[bytes]):
    started = time.perf_counter()
    cache = codec.assemble([codec.decode(f).payload for f in files])
    return cache, time.perf_counter() - started


def nll(model, cache, tokens: list[int], first_logits) -> float:
    """Mean negative log-likelihood of ``tokens`` continuing ``cache``."""
    logits = model.model(mx.array(tokens[:-1])[None], cache=cache)[0]
    logits = mx.concatenate([first_logits, logits], axis=0)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logp, mx.array(tokens)[:, None], axis=-1)
    return -float(picked.mean())


def greedy(model, cache, last_logits, n: int) -> list[int]:
    out, logits = [], last_logits
    for _ in range(n):
        token = int(mx.argmax(logits[-1]))
        out.append(token)
        logits = model.model(mx.array([[token]]), cache=cache)[0]
    return out


def sdpa_decode_ms(
    context: int, quant: KVQuant | None, layers: int, heads: int, kv_heads: int
) -> float:
    """Attention of one decode step over ``context`` positions, every layer, in ms."""
    q = mx.random.normal((1, heads, 1, 64))
    k = mx.random.normal((1, kv_heads, context, 64))
    v = mx.random.normal((1, kv_heads, context, 64))
    if quant is not None:
        qk = mx.quantize(k, group_size=quant.group_size, bits=quant.bits)
        qv = mx.quantize(v, group_size=quant.group_size, bits=quant.bits)
        mx.eval(qk, qv)

        def step():
            return quantized_scaled_dot_product_attention(
                q, qk, qv, scale=0.125, mask=None, group_size=quant.group_size, bits=quant.bits
            )
    else:
        mx.eval(k, v)

        def step():
            return scaled_dot_product_attention(q, k, v, cache=None, scale=0.125, mask=None)

    mx.eval(step())
    runs = 5
    started = time.perf_counter()
    for _ in range(runs):
        mx.eval([step() for _ in range(layers)])
    return (time.perf_counter() - started) / runs * 1000


CHAT_PROMPTS = [
    "Write a Python function that parses an ISO 8601 date and explain each step.",
    "What does `git rebase --onto` do? Give an example with three branches.",
    "Review this code: def add(a, b): return a - b. What is wrong and how do I test it?",
]
SYSTEM = (
    "You are a careful coding assistant working in a large repository. Answer precisely, "
    "show code where it helps, and say what you are unsure of. "
) * 6


def chat_agreement(model, n: int, out: Path | None) -> None:
    """Greedy ``n`` tokens after each chat prompt, its prefix restored from blocks per setting."""
    rows: dict = {}
    for prompt in CHAT_PROMPTS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        tokens = list(model.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        cut = len(tokens) - len(tokens) % BLOCK
        full, _ = prefill(model, tokens[:cut])
        outputs = {}
        for name, quant in SETTINGS.items():
            codec = MLXKVCodec(model.layout, quant)
            restored, _ = restore(codec, block_files(codec, full, tokens[:cut]))
            logits = model.model(mx.array(tokens[cut:])[None], cache=restored)[0]
            outputs[name] = greedy(model, restored, logits[-1:], n)
        for name in ("8", "4"):
            a, b = outputs[name], outputs["off"]
            lead = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
            rows.setdefault(name, []).append(lead)
        print(
            f"{len(tokens)}-token prompt: leading greedy tokens equal to off:",
            {k: v[-1] for k, v in rows.items()},
            flush=True,
        )
    print(json.dumps(rows))
    if out is not None:
        out.write_text(json.dumps({"greedy_tokens": n, "leading_agreement": rows}, indent=1))


def batch_cache(model, quant: KVQuant | None, restored: list | None = None) -> list:
    """A one-row batch cache as the engine builds it (mlx-lm's ``merge`` of a request's
    cache): exact mode's quantized one, else mlx-lm's ``BatchKVCache``."""
    if restored is None and quant is not None and quant.exact:
        restored = exact_prompt_cache(model.model, quant.group_size, quant.bits)
    elif restored is None:
        restored = make_prompt_cache(model.model)
    return [c.merge([c]) for c in restored]


def timed_greedy(model, cache, last_logits, n: int) -> tuple[list[int], float]:
    """``n`` greedy tokens and the mean seconds of a decode step (a forward pass each)."""
    out, logits = [], last_logits
    started = time.perf_counter()
    for _ in range(n):
        token = int(mx.argmax(logits[-1]))
        out.append(token)
        logits = model.model(mx.array([[token]]), cache=cache)[0]
        mx.eval(logits)
    return out, (time.perf_counter() - started) / n


def running_perplexity(model, quant: KVQuant | None, prefix: list[int], scored: list[int]) -> float:
    """Perplexity of ``scored`` after ``prefix``, everything computed in the mode's running
    cache (exact mode: every layer attends to quantized KV, the scored tokens' own too)."""
    cache = batch_cache(model, quant)
    logits = None
    for start in range(0, len(prefix), 256):
        logits = model.model(mx.array(prefix[start : start + 256])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return math.exp(nll(model, cache, scored, logits[0, -1:]))


def running_modes(
    model, context: int, n: int, modes: list[str], out: Path | None, scored: int = 0
) -> None:
    """The running cache per ``kv_mode``: RAM, prefill and decode speed, agreement, hit == miss.

    The prompt is ``context`` tokens of stdlib source and one more: the miss prefills the
    context in 256-token chunks (the engine's step), then its last token alone; the hit
    restores the context from block files cut from the miss's running cache and runs the
    same last token. Both decode ``n`` greedy tokens.
    """
    tokens = corpus_tokens(model.tokenizer, context + 1 + scored)
    prefix, last, after = tokens[:context], tokens[context : context + 1], tokens[context:]
    result: dict = {"context": context, "greedy_tokens": n, "modes": {}}
    baseline = None
    for name in modes:
        quant = MODES[name]
        cache = batch_cache(model, quant)
        started = time.perf_counter()
        for start in range(0, context, 256):
            model.model(mx.array(prefix[start : start + 256])[None], cache=cache)
            mx.eval([c.state for c in cache])
        prefill_s = time.perf_counter() - started
        ram = sum(c.nbytes for c in cache)
        codec = MLXKVCodec(model.layout, quant)
        files = block_files(codec, RowView(cache, 0), prefix)
        logits = model.model(mx.array(last)[None], cache=cache)[0]
        miss, step_s = timed_greedy(model, cache, logits[-1:], n)
        restored = codec.assemble([codec.decode(f).payload for f in files])
        hit_cache = batch_cache(model, quant, restored)
        logits = model.model(mx.array(last)[None], cache=hit_cache)[0]
        hit, _ = timed_greedy(model, hit_cache, logits[-1:], n)
        if baseline is None:
            baseline = miss
        row = {
            "running_bytes_per_token": round(ram / context, 1),
            "prefill_tok_s": round(context / prefill_s, 1),
            "decode_ms_per_step": round(step_s * 1000, 1),
            "file_bytes_per_token": round(sum(len(f) for f in files) / context, 1),
            "hit_equals_miss": hit == miss,
            "hit_leading_agreement": _leading(hit, miss),
            "leading_agreement_with_first": _leading(miss, baseline),
        }
        if scored:
            row["perplexity"] = round(running_perplexity(model, quant, prefix, after[:scored]), 4)
        result["modes"][name] = row
        print(name, json.dumps(row), flush=True)
        del cache, hit_cache, restored
        mx.clear_cache()
    print(json.dumps(result, indent=1))
    if out is not None:
        out.write_text(json.dumps(result, indent=1))


def _leading(a: list[int], b: list[int]) -> int:
    pairs = zip(a, b, strict=False)
    return next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=2048, help="prefix tokens restored")
    parser.add_argument("--scored", type=int, default=512, help="tokens scored after it")
    parser.add_argument("--greedy", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-sdpa", action="store_true", help="skip the attention timing")
    parser.add_argument("--sdpa-only", action="store_true", help="only the attention timing")
    parser.add_argument("--settings", default="off,8,4", help="kv_bits settings to measure")
    parser.add_argument(
        "--chat", action="store_true", help="only greedy agreement on chat prompts (CHAT_PROMPTS)"
    )
    parser.add_argument(
        "--running", action="store_true", help="the running cache per kv_mode (see --modes)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="kv modes for --running")
    args = parser.parse_args()
    model = load_model(None)
    if args.chat:
        return chat_agreement(model, args.greedy, args.out)
    if args.running:
        return running_modes(
            model, args.context, args.greedy, args.modes.split(","), args.out, args.scored
        )
    config = model.config
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    result: dict = {"context": args.context, "sdpa_decode_ms": {}, "settings": {}}
    for context in () if args.no_sdpa else (2048, 8192):
        for name, quant in SETTINGS.items():
            ms = sdpa_decode_ms(context, quant, layers, heads, kv_heads)
            result["sdpa_decode_ms"][f"{name}@{context}"] = round(ms, 3)
            print(
                f"attention per decode step, {context} positions, kv {name}: {ms:.2f} ms",
                flush=True,
            )
    if args.sdpa_only:
        print(json.dumps(result))
        return
    chosen = {name: SETTINGS[name] for name in args.settings.split(",")}
    tokens = corpus_tokens(model.tokenizer, args.context + args.scored)
    prefix, scored = tokens[: args.context], tokens[args.context :]
    full, logits = prefill(model, prefix)
    last = logits[0, -1:]
    baseline_greedy = None
    for name, quant in chosen.items():
        codec = MLXKVCodec(model.layout, quant)
        files = block_files(codec, full, prefix)
        size = sum(len(f) for f in files)
        restored, seconds = restore(codec, files)
        ppl = math.exp(nll(model, restored, scored, last))
        row: dict = {}
        if args.greedy and "off" in chosen:  # agreement needs the unquantized run first
            restored, _ = restore(codec, files)
            tokens_out = greedy(model, restored, last, args.greedy)
            if baseline_greedy is None:
                baseline_greedy = tokens_out
            pairs = list(zip(tokens_out, baseline_greedy, strict=False))
            row["greedy_leading_agreement"] = next(
                (i for i, (a, b) in enumerate(pairs) if a != b), len(pairs)
            )
            row["greedy_positional_agreement"] = round(
                sum(a == b for a, b in pairs) / len(pairs), 3
            )
        row |= {
            "bytes_per_token": size / len(prefix),
            "file_bytes": size,
            "restore_s": round(seconds, 4),
            "perplexity": round(ppl, 4),
        }
        result["settings"][name] = row
        print(name, json.dumps(row), flush=True)
    off = result["settings"].get("off")
    for name in [n for n in ("8", "4") if n in chosen and off is not None]:
        row = result["settings"][name]
        row["bytes_vs_off"] = round(row["bytes_per_token"] / off["bytes_per_token"], 4)
        row["perplexity_vs_off"] = round(row["perplexity"] / off["perplexity"] - 1, 5)
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
