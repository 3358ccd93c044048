"""The scale bench's models: random weights, real geometry, the default model's tokenizer.

    .venv/bin/python bench/bench_models.py [--kind long|8b-geometry] [--layers 24]

Two llama-family models the bench builds itself (seeded, so every build is the same):

- ``long``: small and fast with a 128k context, for traces that grow long (reuse and
  overheads at length);
- ``8b-geometry``: the attention shape of a popular 8B model (8 KV heads x head dim 128,
  24 or 32 layers) with a small hidden size, so its KV per token (196 KB at 24 layers
  in float32) is an 8B model's while its matrix products stay cheap.

Their compute is not a real model's (the weights are random, the hidden size small); their
cache is: the same layers, heads, head dim and dtype as the real thing, so the bytes per
token, per block and per conversation are. Each is written twice from the same tensors:
an mlx-lm folder (omlx, ``mlx_lm.server``) and a GGUF (llama.cpp's server). The tensors
are stored in llama.cpp's row order for Q and K, and the folder says
``rope_traditional`` so both engines compute the same function (DESIGN §5).
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

WORK = Path("/tmp/omlx-bench/scale-models")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True, slots=True)
class Geometry:
    """What shapes the cache (layers, KV heads, head dim, dtype) and what keeps compute small."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    heads: int
    hidden: int
    intermediate: int
    context: int
    rope_theta: float = 1_000_000.0
    dtype: str = "float32"

    @property
    def kv_bytes_per_token(self) -> int:
        itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[self.dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


GEOMETRIES = {
    "long": Geometry(
        "long",
        layers=4,
        kv_heads=2,
        head_dim=64,
        heads=4,
        hidden=256,
        intermediate=512,
        context=131072,
    ),
    "8b-geometry": Geometry(
        "8b-geometry",
        layers=24,
        kv_heads=8,
        head_dim=128,
        heads=8,
        hidden=256,
        intermediate=512,
        context=32768,
    ),
}


def geometry(kind: str, layers: int | None = None) -> Geometry:
    base = GEOMETRIES[kind]
    return base if layers is None else replace(base, layers=layers)


def _tensors(g: Geometry, vocab: int, seed: int = 0):
    """Seeded random weights under llama.cpp's names (GGUF) and mlx-lm's (the folder)."""
    import mlx.core as mx

    mx.random.seed(seed)
    dtype = getattr(mx, g.dtype)

    def rand(*shape: int, scale: float = 0.05):
        return (mx.random.normal(shape) * scale).astype(dtype)

    def ones(n: int):
        return mx.ones((n,), dtype=dtype)

    gguf = {
        "token_embd.weight": rand(vocab, g.hidden, scale=0.5),
        "output_norm.weight": ones(g.hidden),
    }
    folder = {
        "model.embed_tokens.weight": gguf["token_embd.weight"],
        "model.norm.weight": gguf["output_norm.weight"],
    }
    q, kv = g.heads * g.head_dim, g.kv_heads * g.head_dim
    for i in range(g.layers):
        layer = {
            "attn_q": ("self_attn.q_proj", rand(q, g.hidden)),
            "attn_k": ("self_attn.k_proj", rand(kv, g.hidden)),
            "attn_v": ("self_attn.v_proj", rand(kv, g.hidden)),
            "attn_output": ("self_attn.o_proj", rand(g.hidden, q)),
            "ffn_gate": ("mlp.gate_proj", rand(g.intermediate, g.hidden)),
            "ffn_up": ("mlp.up_proj", rand(g.intermediate, g.hidden)),
            "ffn_down": ("mlp.down_proj", rand(g.hidden, g.intermediate)),
            "attn_norm": ("input_layernorm", ones(g.hidden)),
            "ffn_norm": ("post_attention_layernorm", ones(g.hidden)),
        }
        for gguf_name, (mlx_name, w) in layer.items():
            gguf[f"blk.{i}.{gguf_name}.weight"] = w
            folder[f"model.layers.{i}.{mlx_name}.weight"] = w
    return gguf, folder


def _gguf_metadata(g: Geometry, default_gguf: Path, vocab: int) -> dict:
    """Architecture keys for ``g`` plus the default model's tokenizer and chat template."""
    import mlx.core as mx

    _, source = mx.load(str(default_gguf), return_metadata=True)
    meta = {k: v for k, v in source.items() if k.startswith("tokenizer.")}
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    f32 = lambda v: mx.array(v, dtype=mx.float32)  # noqa: E731
    meta |= {
        "general.architecture": "llama",
        "general.name": f"omlx bench {g.name} (random weights)",
        "general.file_type": u32(0 if g.dtype == "float32" else 1),
        "llama.embedding_length": u32(g.hidden),
        "llama.block_count": u32(g.layers),
        "llama.feed_forward_length": u32(g.intermediate),
        "llama.attention.head_count": u32(g.heads),
        "llama.attention.head_count_kv": u32(g.kv_heads),
        "llama.attention.key_length": u32(g.head_dim),
        "llama.attention.value_length": u32(g.head_dim),
        "llama.rope.freq_base": f32(g.rope_theta),
        "llama.rope.dimension_count": u32(g.head_dim),
        "llama.attention.layer_norm_rms_epsilon": f32(1e-5),
        "llama.context_length": u32(g.context),
        "llama.vocab_size": u32(vocab),
    }
    return meta


def build(g: Geometry, tokenizer_folder: Path, default_gguf: Path, out: Path | None = None) -> Path:
    """Write ``g``'s folder (config, tokenizer, weights) and ``model.gguf``; reused when present."""
    import mlx.core as mx

    folder = out or WORK / f"{g.name}-{g.layers}l"
    stamp = folder / "geometry.json"
    if stamp.exists() and json.loads(stamp.read_text()) == asdict(g):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_folder / name).exists():
            shutil.copy(tokenizer_folder / name, folder / name)
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config["model_max_length"] = g.context
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    vocab = json.loads((tokenizer_folder / "config.json").read_text())["vocab_size"]
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": g.hidden,
        "num_hidden_layers": g.layers,
        "intermediate_size": g.intermediate,
        "num_attention_heads": g.heads,
        "num_key_value_heads": g.kv_heads,
        "head_dim": g.head_dim,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "max_position_embeddings": g.context,
        "rope_theta": g.rope_theta,
        "rope_traditional": True,  # Q/K rows in llama.cpp's order, as in the GGUF
        "tie_word_embeddings": True,
        "torch_dtype": g.dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    gguf, weights = _tensors(g, vocab)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    mx.save_gguf(str(folder / "model.gguf"), gguf, _gguf_metadata(g, default_gguf, vocab))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    stamp.write_text(json.dumps(asdict(g)))
    return folder


def main() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import default_gguf, ensure_mlx_lm_folder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=sorted(GEOMETRIES), default="8b-geometry")
    parser.add_argument("--layers", type=int, default=None)
    args = parser.parse_args()
    g = geometry(args.kind, args.layers)
    folder = build(g, ensure_mlx_lm_folder(), default_gguf())
    print(f"{folder}: {g.kv_bytes_per_token / 1000:.1f} KB of KV per token")


if __name__ == "__main__":
    main()
