"""The tokenizer rebuilt from GGUF metadata tokenizes exactly as llama.cpp does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer

from omlx.adapters.mlx.models.errors import ModelNotInstalledError, UnsupportedModelError
from omlx.adapters.mlx.models.gguf import default_model_path, plain_metadata
from omlx.adapters.mlx.models.gguf_tokenizer import (
    build_tokenizer,
    eos_token_ids,
    write_tokenizer_files,
)

ORACLE = Path(__file__).parent.parent / "fixtures" / "smollm2_tokenization.json"
CASES: list[dict[str, Any]] = json.loads(ORACLE.read_text(encoding="utf-8"))["cases"]


@pytest.fixture(scope="module")
def metadata() -> dict[str, Any]:
    try:
        path = default_model_path()
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))
    _, raw = mx.load(str(path), return_metadata=True)
    return plain_metadata(raw)


@pytest.fixture(scope="module")
def tokenizer(
    metadata: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> TokenizerWrapper:
    folder = write_tokenizer_files(metadata, tmp_path_factory.mktemp("smollm2-tokenizer"))
    return load_tokenizer(folder, eos_token_ids=eos_token_ids(metadata))


def test_oracle_has_the_expected_cases() -> None:
    assert len(CASES) == 19


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_tokenizes_like_llama_cpp(tokenizer: TokenizerWrapper, case: dict[str, Any]) -> None:
    assert tokenizer.encode(case["text"]) == case["ids"]
    assert tokenizer.decode(case["ids"]) == case["text"]


def test_streaming_detokenizer_is_bpe_and_reproduces_text(tokenizer: TokenizerWrapper) -> None:
    detok = tokenizer.detokenizer
    assert isinstance(detok, BPEStreamingDetokenizer)
    # mlx-lm's BPE detokenizer drops one leading space of a stream, by design.
    for case in (c for c in CASES if not c["text"].startswith(" ")):
        detok.reset()
        for token in case["ids"]:
            detok.add_token(token)
        detok.finalize()
        assert detok.text == case["text"]


def test_written_files_name_special_tokens_and_template(
    metadata: dict[str, Any], tmp_path: Path
) -> None:
    write_tokenizer_files(metadata, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    specials = json.loads((tmp_path / "special_tokens_map.json").read_text(encoding="utf-8"))

    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["chat_template"] == metadata["tokenizer.chat_template"]
    assert config["add_bos_token"] is False
    assert (config["bos_token"], config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert (config["pad_token"], config["unk_token"]) == ("<|im_end|>", "<|endoftext|>")
    assert specials["eos_token"] == "<|im_end|>"
    assert len(specials["additional_special_tokens"]) == 17
    assert eos_token_ids(metadata) == [2]


def test_chat_template_renders_chatml(tokenizer: TokenizerWrapper) -> None:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_add_bos_token_from_metadata_adds_one_bos(metadata: dict[str, Any], tmp_path: Path) -> None:
    with_bos = {**metadata, "tokenizer.ggml.add_bos_token": True}
    wrapper = load_tokenizer(write_tokenizer_files(with_bos, tmp_path), eos_token_ids=[2])
    plain = CASES[0]
    assert wrapper.encode(plain["text"]) == [1, *plain["ids"]]


@pytest.mark.parametrize(
    ("key", "value"),
    [("tokenizer.ggml.pre", "llama-bpe"), ("tokenizer.ggml.model", "llama")],
)
def test_unsupported_tokenizer_is_refused_by_name(
    metadata: dict[str, Any], tmp_path: Path, key: str, value: str
) -> None:
    changed = {**metadata, key: value}
    with pytest.raises(UnsupportedModelError, match=f"'{value}'"):
        build_tokenizer(changed)
    with pytest.raises(UnsupportedModelError, match=f"'{value}'"):
        write_tokenizer_files(changed, tmp_path / "out")
    assert not (tmp_path / "out").exists()
