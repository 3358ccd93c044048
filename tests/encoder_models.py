"""Tiny embedding and rerank models the tests build: the tiny llama in the folder layouts
omlx serves them from (a sentence-transformers folder; a folder with a rerank omlx.json)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_model import build_tiny_model

# Tokens of the tiny vocabulary (single tokens there): the reranker's verdicts.
YES, NO = "<|im_start|>", "<|endoftext|>"
RERANK_OMLX_JSON = {
    "task": "rerank",
    "prefix": "Decide if the passage answers the question.\n",
    "template": "Task: {instruction}\nQuestion: {query}\nPassage: {document}\n",
    "suffix": "Verdict:",
    "instruction": "find the passage about the capital",
    "yes_token": YES,
    "no_token": NO,
}


def build_embedding_model(
    out: Path, pooling: str = "pooling_mode_lasttoken", normalize: bool = True
) -> Path:
    build_tiny_model(out, seed=3)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
    ]
    modules.append(
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
    )
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir(exist_ok=True)
    flags = dict.fromkeys(
        ["pooling_mode_lasttoken", "pooling_mode_mean_tokens", "pooling_mode_cls_token"], False
    )
    flags[pooling] = True
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, **flags})
    )
    return out


def build_rerank_model(out: Path) -> Path:
    build_tiny_model(out, seed=4)
    (out / "omlx.json").write_text(json.dumps(RERANK_OMLX_JSON))
    return out
