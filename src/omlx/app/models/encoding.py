"""Embeddings and reranking: validate a request, run it on the model's thread, shape the answer.

API-neutral like the chat pipeline: ``api/encoding.py`` translates the OpenAI embeddings
and the Cohere/Jina rerank bodies to these calls.
"""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from omlx.app.chat.prompt_limit import PromptLimit
from omlx.app.errors import InvalidRequest

if TYPE_CHECKING:  # built by the loader; the services only call them
    from omlx.adapters.mlx.models.encoders import EmbeddingModel, RerankModel
    from omlx.adapters.mlx.models.runner import MLXRunner

MAX_INPUTS = 2048  # per request, as OpenAI's embeddings API allows


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: list[list[float]] | list[str]  # floats, or base64 float32 when asked
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Ranked:
    index: int
    score: float


class EmbeddingService:
    """Embeddings of one embedding model on its worker thread."""

    def __init__(self, runner: MLXRunner, model: EmbeddingModel) -> None:
        self.runner = runner
        self.model = model
        self.limit = PromptLimit.of(model.tokenizer, model.context_length)

    async def embed(
        self, inputs: str | Sequence[Any], *, dimensions: int | None = None, encoding: str = "float"
    ) -> Embedded:
        batch = await anyio.to_thread.run_sync(self._tokenize, inputs)  # long texts take a while
        dims = self.model.dimensions
        if dimensions is not None and not 1 <= dimensions <= dims:
            raise InvalidRequest(
                f"dimensions must be between 1 and {dims} for this model", param="dimensions"
            )
        if encoding not in ("float", "base64"):
            raise InvalidRequest("encoding_format must be float or base64", param="encoding_format")
        vectors = await asyncio.wrap_future(self.runner.submit(lambda: self.model.embed(batch)))
        if dimensions is not None and dimensions < dims:
            vectors = [_truncated(v, dimensions, self.model.normalize) for v in vectors]
        if encoding == "base64":
            vectors = [
                base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii") for v in vectors
            ]
        return Embedded(vectors, sum(len(t) for t in batch))

    def _tokenize(self, inputs: str | Sequence[Any]) -> list[list[int]]:
        items: list[Any]
        if isinstance(inputs, str):
            items = [inputs]
        elif inputs and all(isinstance(t, int) and not isinstance(t, bool) for t in inputs):
            items = [list(inputs)]  # one token array
        else:
            items = list(inputs)
        if not items:
            raise InvalidRequest("input must not be empty", param="input")
        if len(items) > MAX_INPUTS:
            raise InvalidRequest(f"at most {MAX_INPUTS} inputs per request", param="input")
        vocab = len(self.model.tokenizer)
        out = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                if not item:
                    raise InvalidRequest(f"input[{i}] is an empty string", param="input")
                self.limit.check(item, "input", f"input[{i}]")
                tokens = list(self.model.tokenizer.encode(item))
            elif (
                isinstance(item, list)
                and item
                and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
            ):
                if any(not 0 <= t < vocab for t in item):
                    raise InvalidRequest(
                        f"input[{i}]: token ids must be in [0, {vocab})", param="input"
                    )
                tokens = item
            else:
                raise InvalidRequest(
                    f"input[{i}] must be a string or a list of token ids", param="input"
                )
            if len(tokens) > self.model.context_length:
                raise InvalidRequest(
                    f"input[{i}] has {len(tokens)} tokens; this model's context is "
                    f"{self.model.context_length}",
                    param="input",
                )
            out.append(tokens)
        return out


def _truncated(vector: list[float], dimensions: int, normalize: bool) -> list[float]:
    """The first ``dimensions`` values (Matryoshka truncation), normalized again if the model is."""
    head = vector[:dimensions]
    if not normalize:
        return head
    norm = math.sqrt(sum(x * x for x in head)) or 1.0
    return [x / norm for x in head]


class RerankService:
    """Relevance of documents to a query by one rerank model on its worker thread."""

    def __init__(self, runner: MLXRunner, model: RerankModel) -> None:
        self.runner = runner
        self.model = model
        self.limit = PromptLimit.of(model.tokenizer, model.context_length)

    async def rank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        instruction: str | None = None,
    ) -> tuple[list[Ranked], int]:
        if not query:
            raise InvalidRequest("query must not be empty", param="query")
        if not documents:
            raise InvalidRequest("documents must not be empty", param="documents")
        if len(documents) > MAX_INPUTS:
            raise InvalidRequest(f"at most {MAX_INPUTS} documents per request", param="documents")
        if top_n is not None and top_n < 1:
            raise InvalidRequest("top_n must be at least 1", param="top_n")
        prompts = await anyio.to_thread.run_sync(self._tokenize, query, documents, instruction)
        scores = await asyncio.wrap_future(self.runner.submit(lambda: self.model.score(prompts)))
        ranked = sorted(
            (Ranked(i, s) for i, s in enumerate(scores)), key=lambda r: (-r.score, r.index)
        )
        return ranked[: top_n or len(ranked)], sum(len(p) for p in prompts)

    def _tokenize(
        self, query: str, documents: Sequence[str], instruction: str | None
    ) -> list[list[int]]:
        """Each document's prompt with the query, as tokens (on a worker thread: it takes a while)."""
        prompts = []
        for i, document in enumerate(documents):
            text = self.model.prompt.render(query, document, instruction)
            self.limit.check(text, "documents", f"documents[{i}] with the query")
            tokens = list(self.model.tokenizer.encode(text))
            if len(tokens) > self.model.context_length:
                raise InvalidRequest(
                    f"documents[{i}] with the query is {len(tokens)} tokens; this model's context "
                    f"is {self.model.context_length}",
                    param="documents",
                )
            prompts.append(tokens)
        return prompts
