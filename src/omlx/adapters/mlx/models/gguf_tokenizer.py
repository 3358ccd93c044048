"""Rebuild a Hugging Face tokenizer from the vocabulary stored in GGUF metadata.

A GGUF file carries its tokenizer as metadata (tokens, merges, token types, special
ids, chat template). mlx-lm wants a folder with `tokenizer.json` and friends, so we
rebuild one with `tokenizers` and write it out. Only tokenizers whose llama.cpp
pre-tokenizer we reproduce exactly are accepted; anything else is an error, because a
tokenizer that silently splits text differently from the model's training is worse than
none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from omlx.adapters.mlx.models.errors import UnsupportedModelError

# llama.cpp token types (llama_token_type): 3 is CONTROL, 4 USER_DEFINED. llama.cpp
# matches both kinds verbatim in the input text before BPE runs.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def _smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # llama.cpp's "smollm" pre-type: every digit on its own, then the GPT-2 regex.
    # Checked against llama.cpp on tests/fixtures/smollm2_tokenization.json.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


# `tokenizer.ggml.pre` -> pre-tokenizer. Add an entry only with an oracle test that
# shows it matches llama.cpp token for token.
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "smollm": _smollm_pre_tokenizer,
}


def _plain(value: Any) -> Any:
    """Metadata values may still be mlx arrays; turn them into Python values."""
    return value.tolist() if hasattr(value, "tolist") else value


def _get(metadata: Mapping[str, Any], key: str, default: Any = None) -> Any:
    return _plain(metadata[key]) if key in metadata else default


def _token(tokens: list[str], key: str, metadata: Mapping[str, Any]) -> str | None:
    """The token string for a special-id metadata key, or None when absent."""
    idx = _get(metadata, key)
    if idx is None or not 0 <= int(idx) < len(tokens):
        return None
    return tokens[int(idx)]


def _tokens_and_types(metadata: Mapping[str, Any]) -> tuple[list[str], list[int]]:
    if "tokenizer.ggml.tokens" not in metadata:
        raise UnsupportedModelError("GGUF metadata has no tokenizer (tokenizer.ggml.tokens)")
    tokens: list[str] = list(_get(metadata, "tokenizer.ggml.tokens"))
    types: list[int] = list(_get(metadata, "tokenizer.ggml.token_type", [1] * len(tokens)))
    if len(types) != len(tokens):
        raise UnsupportedModelError("GGUF token_type and tokens differ in length")
    return tokens, types


def _check_supported(metadata: Mapping[str, Any]) -> str:
    model = _get(metadata, "tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedModelError(
            f"GGUF tokenizer model {model!r} is not supported (only byte-level BPE, 'gpt2')"
        )
    pre = _get(metadata, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"GGUF pre-tokenizer {pre!r} is not supported "
            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))}); "
            "tokenizing it with another pre-tokenizer would split text wrongly"
        )
    return pre


def build_tokenizer(metadata: Mapping[str, Any]) -> Tokenizer:
    """A `tokenizers.Tokenizer` equivalent to llama.cpp's for this GGUF metadata."""
    pre = _check_supported(metadata)
    tokens, types = _tokens_and_types(metadata)
    merges_raw: list[str] = list(_get(metadata, "tokenizer.ggml.merges", []))

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        # A dict vocabulary cannot give two ids to one string; ids would shift.
        raise UnsupportedModelError("GGUF vocabulary has duplicate tokens")
    merges: list[tuple[str, str]] = []
    for merge in merges_raw:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise UnsupportedModelError(f"GGUF merge {merge!r} is not a pair")
        merges.append((parts[0], parts[1]))

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()

    specials = [t for t, kind in zip(tokens, types, strict=True) if kind == TOKEN_TYPE_CONTROL]
    user = [t for t, kind in zip(tokens, types, strict=True) if kind == TOKEN_TYPE_USER_DEFINED]
    # normalized=False: matched on the raw text, as llama.cpp does. The ids already
    # exist in the vocabulary, so adding them does not grow it.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if user:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    tok.post_processor = _post_processor(tokens, metadata)
    return tok


def _post_processor(
    tokens: list[str], metadata: Mapping[str, Any]
) -> processors.PostProcessor | None:
    """BOS/EOS insertion as the metadata asks; None when neither is added."""
    ends: dict[str, tuple[str, int] | None] = {}
    for end in ("bos", "eos"):
        idx = _get(metadata, f"tokenizer.ggml.{end}_token_id")
        wanted = bool(_get(metadata, f"tokenizer.ggml.add_{end}_token", False))
        ok = wanted and idx is not None and 0 <= int(idx) < len(tokens)
        ends[end] = (tokens[int(idx)], int(idx)) if ok else None
    bos, eos = ends["bos"], ends["eos"]
    if bos is None and eos is None:
        return None

    def template(seq: str, type_id: int) -> list[str]:
        head = [f"{bos[0]}:{type_id}"] if bos else []
        tail = [f"{eos[0]}:{type_id}"] if eos else []
        return [*head, f"{seq}:{type_id}", *tail]

    single = template("$A", 0)
    pair = single + template("$B", 1)
    return processors.TemplateProcessing(
        single=" ".join(single),
        pair=" ".join(pair),
        special_tokens=sorted({t for t in (bos, eos) if t is not None}),
    )


def eos_token_ids(metadata: Mapping[str, Any]) -> list[int]:
    """The end-of-sequence ids named by the metadata (no guessing from the vocabulary)."""
    eos = _get(metadata, "tokenizer.ggml.eos_token_id")
    return [] if eos is None else [int(eos)]


def tokenizer_config(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The `tokenizer_config.json` contents for this metadata."""
    tokens, _ = _tokens_and_types(metadata)
    config: dict[str, Any] = {
        # The generic class: model-specific classes may rebuild the pre-tokenizer.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_get(metadata, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_get(metadata, "tokenizer.ggml.add_eos_token", False)),
        # llama.cpp detokenizes verbatim; HF's clean-up would drop spaces before '.'.
        "clean_up_tokenization_spaces": False,
    }
    names = {
        "bos_token": "tokenizer.ggml.bos_token_id",
        "eos_token": "tokenizer.ggml.eos_token_id",
        "pad_token": "tokenizer.ggml.padding_token_id",
        "unk_token": "tokenizer.ggml.unknown_token_id",
    }
    for name, key in names.items():
        if (value := _token(tokens, key, metadata)) is not None:
            config[name] = value
    if (template := _get(metadata, "tokenizer.chat_template")) is not None:
        config["chat_template"] = template
    arch = _get(metadata, "general.architecture")
    if (ctx := _get(metadata, f"{arch}.context_length")) is not None:
        config["model_max_length"] = int(ctx)
    return config


def write_tokenizer_files(metadata: Mapping[str, Any], out_dir: Path | str) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json.

    The folder then loads with `mlx_lm.tokenizer_utils.load` (byte-level BPE, so mlx-lm
    picks its BPE streaming detokenizer).
    """
    tok = build_tokenizer(metadata)  # raises for unsupported tokenizers before writing
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")

    config = tokenizer_config(metadata)
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    named = ("bos_token", "eos_token", "pad_token", "unk_token")
    special_map: dict[str, Any] = {k: config[k] for k in named if k in config}
    tokens, types = _tokens_and_types(metadata)
    special_map["additional_special_tokens"] = [
        t for t, kind in zip(tokens, types, strict=True) if kind == TOKEN_TYPE_CONTROL
    ]
    (out / "special_tokens_map.json").write_text(
        json.dumps(special_map, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return out
