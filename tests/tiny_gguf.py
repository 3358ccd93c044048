"""A tiny llama GGUF file with seeded random weights and a small byte-level BPE vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France."]


def _tiny_vocab() -> tuple[list[str], list[str]]:
    """A small byte-level BPE vocabulary (tokens by id, merges as 'a b')."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def _tiny_gguf_tensors(vocab: int, tied: bool) -> dict[str, mx.array]:
    """Seeded random llama weights under llama.cpp's tensor names."""
    mx.random.seed(0)
    head_dim = HIDDEN // HEADS

    def rand(*shape: int) -> mx.array:
        return mx.random.normal(shape) * 0.1

    tensors = {"token_embd.weight": rand(vocab, HIDDEN), "output_norm.weight": 1 + rand(HIDDEN)}
    if not tied:
        tensors["output.weight"] = rand(vocab, HIDDEN)
    for i in range(LAYERS):
        tensors |= {
            f"blk.{i}.attn_q.weight": rand(HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_k.weight": rand(KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_v.weight": rand(KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_output.weight": rand(HIDDEN, HEADS * head_dim),
            f"blk.{i}.ffn_gate.weight": rand(FFN, HIDDEN),
            f"blk.{i}.ffn_up.weight": rand(FFN, HIDDEN),
            f"blk.{i}.ffn_down.weight": rand(HIDDEN, FFN),
            f"blk.{i}.attn_norm.weight": 1 + rand(HIDDEN),
            f"blk.{i}.ffn_norm.weight": 1 + rand(HIDDEN),
        }
    return tensors


def write_tiny_gguf(
    path: Path, *, arch: str = "llama", tied: bool = False, extra: dict[str, mx.array] | None = None
) -> dict[str, mx.array]:
    tokens, merges = _tiny_vocab()
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    metadata: dict[str, Any] = {
        "general.architecture": arch,
        f"{arch}.embedding_length": u32(HIDDEN),
        f"{arch}.block_count": u32(LAYERS),
        f"{arch}.feed_forward_length": u32(FFN),
        f"{arch}.attention.head_count": u32(HEADS),
        f"{arch}.attention.head_count_kv": u32(KV_HEADS),
        f"{arch}.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        f"{arch}.rope.dimension_count": u32(HIDDEN // HEADS),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        f"{arch}.context_length": u32(512),
        f"{arch}.vocab_size": u32(len(tokens)),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array(
            [3 if t in SPECIALS else 1 for t in tokens], dtype=mx.int32
        ),
        "tokenizer.ggml.bos_token_id": u32(1),
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    tensors = _tiny_gguf_tensors(len(tokens), tied) | (extra or {})
    mx.save_gguf(str(path), tensors, metadata)
    return tensors
