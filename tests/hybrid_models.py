"""Tiny random-weight models of the cache layouts people run, as mlx-lm folders.

- ``qwen3_next``: gated-delta (linear attention, ``ArraysCache``) layers between full
  attention layers (Qwen3-Next / Qwen3.5's layout);
- ``gemma3_text``: sliding-window layers (``RotatingKVCache``, window 32) between global
  ones (Gemma 3's);
- ``falcon_h1``: every layer a ``CacheList`` of a Mamba2 state and a KV cache (parallel
  hybrid);
- ``nemotron_h``: Mamba2 and attention layers, which mlx-lm 0.32 prefills wrongly in a
  batch (the cache stays off for it).

Each uses the tiny test tokenizer and its ChatML template, so ``omlx serve`` runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_model import build_tokenizer

BASE = {"max_position_embeddings": 4096, "rms_norm_eps": 1e-6}
CONFIGS = {
    "qwen3_next": dict(
        model_type="qwen3_next",
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=0,
        num_experts_per_tok=0,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=0,
        mlp_only_layers=[],
        moe_intermediate_size=0,
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        full_attention_interval=2,
        tie_word_embeddings=False,
    ),
    "gemma3_text": dict(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        head_dim=16,
        num_key_value_heads=2,
        query_pre_attn_scalar=16,
        sliding_window=32,
        sliding_window_pattern=2,
    ),
    "falcon_h1": dict(
        model_type="falcon_h1",
        hidden_size=64,
        head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=128,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=16,
        mamba_n_groups=1,
        mamba_d_conv=4,
    ),
    "nemotron_h": dict(
        model_type="nemotron_h",
        hidden_size=64,
        num_hidden_layers=4,
        hybrid_override_pattern="M*M*",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=1,
        conv_kernel=4,
        intermediate_size=128,
        mamba_hidden_act="silu",
        mlp_hidden_act="relu2",
        attention_bias=False,
        mlp_bias=False,
        use_conv_bias=True,
        mamba_proj_bias=False,
        use_bias=False,
        layer_norm_epsilon=1e-5,
        residual_in_fp32=False,
        chunk_size=16,
        time_step_limit=[0.0, float("inf")],
        time_step_min=0.001,
        time_step_max=0.1,
        time_step_floor=1e-4,
        rescale_prenorm_residual=True,
        tie_word_embeddings=False,
    ),
}


def build_hybrid_model(family: str, out: Path, seed: int = 0, **overrides) -> Path:
    """Write the tiny ``family`` model (a seeded mlx-lm folder) into ``out``.

    ``overrides`` change its config (benchmarks make it deeper, so prefill costs time).
    """
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    config = {**BASE, **CONFIGS[family], "vocab_size": vocab, **overrides}
    module = importlib.import_module(f"mlx_lm.models.{family}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    # Peaked logits: greedy choices far from ties, so batched and unbatched runs agree.
    for name in list(params):
        if name.endswith(("embed_tokens.weight", "lm_head.weight", "embeddings.weight")):
            params[name] = params[name] * 16.0
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
