"""Embeddings (OpenAI's shape) and rerank (Cohere's and Jina's shape) bodies, as msgspec Structs."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType


class EmbeddingsRequest(Struct, kw_only=True):
    model: str
    input: str | list[Any]  # a string, token ids, or a batch of either
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class Embedding(Struct):
    index: int
    embedding: list[float] | str
    object: Literal["embedding"] = "embedding"


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: Literal["list"] = "list"


class RerankDocument(Struct, kw_only=True):
    text: str


class RerankRequest(Struct, kw_only=True):
    model: str
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = None
    return_documents: bool = False
    instruction: str | None = None  # the reranker's task instruction (its omlx.json default)


class RerankResult(Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | UnsetType = UNSET


class RerankUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(Struct):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage
