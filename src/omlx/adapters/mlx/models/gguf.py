"""Load a llama-family GGUF file straight into mlx-lm's llama model.

`mx.load` reads GGUF tensors (keeping Q4_0/Q4_1/Q4_K/Q8_0 ones quantized as
weight/scales/biases with groups of 32) and the metadata; this module maps both to
mlx-lm's names and config, so no conversion step is needed to serve a GGUF file.
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from omlx.adapters.mlx.models.default_model import (
    default_model_path,  # noqa: F401  (re-exported: callers find it here)
)
from omlx.adapters.mlx.models.errors import UnsupportedModelError
from omlx.adapters.mlx.models.gguf_tokenizer import eos_token_ids, write_tokenizer_files
from omlx.adapters.mlx.models.tokenizer_loader import load_tokenizer
from omlx.domain.model_ids import DEFAULT_MODEL_ID  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)


# mx.load splits every quantized GGUF tensor into groups of 32 weights.
GGUF_GROUP_SIZE = 32

_TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_PER_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TENSOR_NAME = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|scales|biases)$")


@dataclass(frozen=True, slots=True)
class GGUFContents:
    """A GGUF file's tensors renamed for mlx-lm, with the config it implies."""

    config: dict[str, Any]
    weights: dict[str, mx.array]
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LoadedGGUF:
    """A ready model: evaluated weights, its tokenizer, and where they came from."""

    model: nn.Module
    tokenizer: Any  # mlx-lm's TokenizerWrapper (tokenizer_loader)
    config: dict[str, Any]
    metadata: dict[str, Any]
    weights: dict[str, mx.array]


def plain_metadata(raw: dict[str, Any]) -> dict[str, Any]:
    """GGUF metadata with mlx arrays turned into Python scalars and lists."""
    return {k: v.tolist() if isinstance(v, mx.array) else v for k, v in raw.items()}


def _read(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        tensors, raw = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as exc:
        # mx.load fails on tensor types it has no decoder for (and on broken files).
        raise UnsupportedModelError(
            f"mx.load cannot read {path} (unsupported tensor type or not GGUF): {exc}"
        ) from exc
    return tensors, plain_metadata(raw)


def _config(metadata: dict[str, Any], tensors: dict[str, mx.array]) -> dict[str, Any]:
    """mlx-lm's llama config.json form, from `llama.*` metadata."""
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported (only 'llama')")

    def meta(key: str, default: Any = None) -> Any:
        value = metadata.get(f"llama.{key}", default)
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata lacks 'llama.{key}'")
        return value

    hidden = int(meta("embedding_length"))
    heads = int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    rope_dims = int(meta("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise UnsupportedModelError(
            f"partial rotary embeddings (rope.dimension_count={rope_dims}, "
            f"head_dim={head_dim}) are not supported"
        )
    scaling = metadata.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise UnsupportedModelError(f"GGUF rope scaling {scaling!r} is not supported")
    if "rope_freqs.weight" in tensors:
        raise UnsupportedModelError("GGUF rope frequency factors (rope_freqs) are not supported")
    if int(metadata.get("llama.expert_count", 0)):
        raise UnsupportedModelError("GGUF llama mixture-of-experts models are not supported")
    if "token_embd.weight" not in tensors:
        raise UnsupportedModelError("GGUF file has no token_embd.weight tensor")

    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(meta("block_count")),
        "intermediate_size": int(meta("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon")),
        # The embedding's rows, not llama.vocab_size (absent in older files).
        "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "max_position_embeddings": int(meta("context_length")),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        # llama.cpp permutes Q/K rows for interleaved (GPT-J style) rotary pairs.
        "rope_traditional": True,
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    for name in ("bos", "eos"):
        if (idx := metadata.get(f"tokenizer.ggml.{name}_token_id")) is not None:
            config[f"{name}_token_id"] = int(idx)
    return config


def _rename(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    renamed: dict[str, mx.array] = {}
    for name, value in tensors.items():
        match = _TENSOR_NAME.match(name)
        if match is None:
            raise UnsupportedModelError(f"unexpected GGUF tensor {name!r}")
        layer, base, suffix = match.groups()
        table = _PER_LAYER if layer is not None else _TOP_LEVEL
        if base not in table:
            raise UnsupportedModelError(f"unexpected GGUF tensor {name!r}")
        prefix = f"model.layers.{layer}.{table[base]}" if layer is not None else table[base]
        renamed[f"{prefix}.{suffix}"] = value
    return renamed


def _quantized_bits(weights: dict[str, mx.array]) -> dict[str, int]:
    """Bits per quantized module: a group of 32 packs into `bits` uint32 words."""
    bits: dict[str, int] = {}
    for key, scales in weights.items():
        if key.endswith(".scales"):
            prefix = key.removesuffix(".scales")
            bits[prefix] = weights[f"{prefix}.weight"].shape[-1] // scales.shape[-1]
    return bits


def _dequantized(weights: dict[str, mx.array], bits: dict[str, int]) -> dict[str, mx.array]:
    """Every tensor as float32: MLX's quantized matmul is slow on CPU."""
    out: dict[str, mx.array] = {}
    for key, value in weights.items():
        prefix, _, suffix = key.rpartition(".")
        if prefix in bits:
            if suffix != "weight":
                continue
            # float32 scales so the affine step is done in float32, as llama.cpp does.
            value = mx.dequantize(
                value,
                weights[f"{prefix}.scales"].astype(mx.float32),
                weights[f"{prefix}.biases"].astype(mx.float32),
                group_size=GGUF_GROUP_SIZE,
                bits=bits[prefix],
            )
        out[key] = value.astype(mx.float32)
        # One tensor at a time: evaluating all at once was ~3x slower here.
        mx.eval(out[key])
    return out


def _quantization_config(bits: dict[str, int]) -> dict[str, Any]:
    """mlx-lm's `quantization` entry: the common bit width plus per-layer exceptions."""
    default = Counter(bits.values()).most_common(1)[0][0]
    config: dict[str, Any] = {"group_size": GGUF_GROUP_SIZE, "bits": default, "mode": "affine"}
    for prefix, b in sorted(bits.items()):
        if b != default:
            config[prefix] = {"group_size": GGUF_GROUP_SIZE, "bits": b, "mode": "affine"}
    return config


def read_gguf(path: Path | str, *, dequantize: bool) -> GGUFContents:
    """Read a llama GGUF file into mlx-lm names and config, without building a model.

    With `dequantize`, every tensor comes back float32; otherwise quantized tensors
    stay packed and the config carries a `quantization` entry.
    """
    tensors, metadata = _read(Path(path))
    config = _config(metadata, tensors)
    weights = _rename(tensors)
    bits = _quantized_bits(weights)
    if dequantize:
        weights = _dequantized(weights, bits)
    elif bits:
        config["quantization"] = _quantization_config(bits)
        # float32 scales and activations: with GGUF's float16 scales the model
        # computes in float16, which on CPU was 40x slower and changed SmolLM2's
        # greedy reply; quantized matmul in float32 matches the dequantized model.
        weights = {
            k: v if v.dtype == mx.uint32 else v.astype(mx.float32) for k, v in weights.items()
        }
    return GGUFContents(config=config, weights=weights, metadata=metadata)


def build_model(
    config: dict[str, Any], weights: dict[str, mx.array]
) -> tuple[nn.Module, dict[str, mx.array]]:
    """An evaluated mlx-lm llama model holding `weights`; returns the weights it took."""
    model = llama.Model(llama.ModelArgs.from_dict(config))
    weights = model.sanitize(dict(weights))
    if (quantization := config.get("quantization")) is not None:

        def predicate(path: str, module: nn.Module) -> bool | dict[str, Any]:
            if f"{path}.scales" not in weights:
                return False
            bits = weights[f"{path}.weight"].shape[-1] // weights[f"{path}.scales"].shape[-1]
            return {"group_size": quantization["group_size"], "bits": bits, "mode": "affine"}

        nn.quantize(
            model,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            class_predicate=predicate,
        )
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    model.eval()
    return model, weights


def load_gguf_tokenizer(metadata: dict[str, Any], tokenizer_dir: Path | str | None = None) -> Any:
    """mlx-lm's tokenizer wrapper for the GGUF vocabulary (files go to a temp dir if none)."""
    eos = eos_token_ids(metadata) or None
    if tokenizer_dir is not None:
        folder = write_tokenizer_files(metadata, tokenizer_dir)
        return load_tokenizer(folder, eos_token_ids=eos)
    # The tokenizer is fully read into memory, so the folder can go afterwards.
    with tempfile.TemporaryDirectory(prefix="omlx-gguf-tok-") as tmp:
        return load_tokenizer(write_tokenizer_files(metadata, tmp), eos_token_ids=eos)


def load_gguf(
    path: Path | str,
    *,
    dequantize: bool | None = None,
    tokenizer_dir: Path | str | None = None,
) -> LoadedGGUF:
    """Load a llama GGUF file as an mlx-lm model and tokenizer.

    `dequantize=None` dequantizes to float32 on the CPU device and keeps quantized
    weights elsewhere (Metal, CUDA), where MLX's quantized matmul is fast.
    """
    start = time.perf_counter()
    if dequantize is None:
        dequantize = mx.default_device().type == mx.cpu
    contents = read_gguf(path, dequantize=dequantize)
    tokenizer = load_gguf_tokenizer(contents.metadata, tokenizer_dir)
    model, weights = build_model(contents.config, contents.weights)
    log.info(
        "loaded %s (%d layers, %s) in %.1f s",
        path,
        contents.config["num_hidden_layers"],
        "float32" if dequantize else "quantized",
        time.perf_counter() - start,
    )
    return LoadedGGUF(
        model=model,
        tokenizer=tokenizer,
        config=contents.config,
        metadata=contents.metadata,
        weights=weights,
    )
