"""Embedding and rerank models: decoders mlx-lm loads, read out another way than by sampling.

- *Embedding*: a sentence-transformers folder (``modules.json``) around a decoder
  (Qwen3-Embedding's layout). The decoder's final hidden states are pooled as its
  ``Pooling`` module says (last token, mean, or first token) and L2-normalized when it
  has a ``Normalize`` module.
- *Rerank*: a causal LM scored by the logits of a "yes" and a "no" token after a prompt
  that asks whether a document answers a query (Qwen3-Reranker's approach). The folder's
  ``omlx.json`` gives the prompt (``prefix``, ``template`` with ``{query}``, ``{document}``
  and ``{instruction}``, ``suffix``), the default instruction and the two tokens; the
  score is ``P(yes) = sigmoid(logit_yes - logit_no)``.

Both run on the model's ``MLXRunner`` thread: these functions are called there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load as mlx_lm_load

POOLINGS = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "first",
}


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters (what loading it costs in RAM)."""
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


@dataclass(slots=True)
class EmbeddingModel:
    model_id: str
    path: Path
    model: nn.Module
    tokenizer: Any
    dimensions: int
    pooling: str  # last | mean | first
    normalize: bool
    context_length: int

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One vector per token list, in order (one forward pass each: no padding to mask)."""
        out = []
        for tokens in inputs:
            hidden = self.model.model(mx.array([tokens]))[0]  # (positions, hidden)
            if self.pooling == "last":
                vector = hidden[-1]
            elif self.pooling == "first":
                vector = hidden[0]
            else:
                vector = hidden.mean(axis=0)
            vector = vector.astype(mx.float32)
            if self.normalize:
                vector = vector / mx.maximum(mx.linalg.norm(vector), 1e-12)
            out.append(vector.tolist())
        return out


def load_embedding_model(path: Path, model_id: str) -> EmbeddingModel:
    """Load a sentence-transformers folder whose first module is an mlx-lm decoder."""
    modules = json.loads((path / "modules.json").read_text())
    pooling, normalize = "mean", False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Pooling"):
            pooling = _pooling_of(path / module.get("path", ""), path)
        elif kind.endswith("Normalize"):
            normalize = True
    model, tokenizer, config = mlx_lm_load(str(path), return_config=True)
    if not callable(getattr(model, "model", None)):
        raise ValueError(f"{path}: its mlx-lm model has no inner .model giving hidden states")
    return EmbeddingModel(
        model_id=model_id,
        path=path,
        model=model,
        tokenizer=tokenizer,
        dimensions=int(config["hidden_size"]),
        pooling=pooling,
        normalize=normalize,
        context_length=int(config.get("max_position_embeddings") or 4096),
    )


def _pooling_of(folder: Path, root: Path) -> str:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{root}: its pooling module has no readable config.json ({exc})") from exc
    chosen = [POOLINGS[k] for k, v in config.items() if k in POOLINGS and v]
    if len(chosen) != 1:
        raise ValueError(
            f"{root}: pooling {sorted(k for k, v in config.items() if v)} is not one of "
            "last-token, mean or first-token pooling"
        )
    return chosen[0]


@dataclass(frozen=True, slots=True)
class RerankPrompt:
    prefix: str
    template: str  # with {query}, {document} and {instruction}
    suffix: str
    instruction: str

    def render(self, query: str, document: str, instruction: str | None) -> str:
        body = self.template.format(
            query=query, document=document, instruction=instruction or self.instruction
        )
        return self.prefix + body + self.suffix


@dataclass(slots=True)
class RerankModel:
    model_id: str
    path: Path
    model: nn.Module
    tokenizer: Any
    prompt: RerankPrompt
    yes_id: int
    no_id: int
    context_length: int

    def score(self, prompts: list[list[int]]) -> list[float]:
        """P(yes) for each tokenized prompt, in order."""
        scores = []
        for tokens in prompts:
            logits = self.model(mx.array([tokens]))[0, -1].astype(mx.float32)
            margin = (logits[self.yes_id] - logits[self.no_id]).item()
            scores.append(1.0 / (1.0 + math.exp(-margin)))
        return scores


def load_rerank_model(path: Path, model_id: str) -> RerankModel:
    declared = json.loads((path / "omlx.json").read_text())
    try:
        prompt = RerankPrompt(
            prefix=declared.get("prefix", ""),
            template=declared["template"],
            suffix=declared.get("suffix", ""),
            instruction=declared.get("instruction", ""),
        )
        yes, no = declared["yes_token"], declared["no_token"]
    except KeyError as exc:
        raise ValueError(f"{path}/omlx.json: a reranker needs {exc.args[0]!r}") from None
    model, tokenizer, config = mlx_lm_load(str(path), return_config=True)
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in (yes, no)]
    if any(len(i) != 1 for i in ids):
        raise ValueError(
            f"{path}/omlx.json: yes_token {yes!r} and no_token {no!r} must be one token each"
        )
    return RerankModel(
        model_id=model_id,
        path=path,
        model=model,
        tokenizer=tokenizer,
        prompt=prompt,
        yes_id=ids[0][0],
        no_id=ids[1][0],
        context_length=int(config.get("max_position_embeddings") or 4096),
    )
