"""A tiny random-weight llama model that the test suite builds itself.

Seeded, two layers, a byte-level BPE tokenizer trained on a few sentences, a
ChatML template: small enough for fast engine and API tests, real enough that
mlx-lm loads it like any model folder.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Paris is the capital of France.",
    "def add(a, b):\n    return a + b\n",
    "Caching prefixes makes the second turn fast. Überraschung: naïve café ☕ 日本語",
    "system user assistant tool 0123456789",
]


def build_tokenizer(out: Path, vocab_size: int = 384) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "chat_template": CHAT_TEMPLATE,
                "add_bos_token": False,
                "model_max_length": 2048,
            }
        )
    )


def build_tiny_model(out: Path, seed: int = 0, layers: int = 2, **config_overrides: object) -> Path:
    """Write an mlx-lm llama folder with seeded random weights into ``out``
    (``config_overrides``: other config.json values, e.g. a wider model)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": layers,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": len(vocab) + 0,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        **config_overrides,
    }
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    # Large-magnitude embeddings and head make logits peaked and varied, so greedy
    # choices are far from ties (identical across batch shapes) and not one token repeated.
    params = dict(tree_flatten(model.parameters()))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        params[name] = params[name] * 16.0
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
