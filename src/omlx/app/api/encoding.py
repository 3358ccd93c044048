"""``POST /v1/embeddings`` (OpenAI) and ``POST /v1/rerank`` (Cohere / Jina), over the pool."""

from __future__ import annotations

import uuid

from litestar import Controller, post
from msgspec import UNSET

from omlx.app.api.encoding_schemas import (
    Embedding,
    EmbeddingList,
    EmbeddingsRequest,
    EmbeddingUsage,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from omlx.app.api.openai.schemas import OpenAIErrorResponse
from omlx.app.api.openapi import error_responses
from omlx.app.models.catalog import EMBEDDING, RERANK
from omlx.app.models.pool import ModelPool

_ERRORS = error_responses(OpenAIErrorResponse, 400, 401, 404, 413, 429, 500)


class EncodingController(Controller):
    path = "/v1"
    tags = ("encoders",)

    @post(
        "/embeddings",
        status_code=200,
        operation_id="createEmbedding",
        summary="Embeddings of strings or token ids by an embedding model",
        responses=_ERRORS,
    )
    async def embeddings(self, data: EmbeddingsRequest, pool: ModelPool) -> EmbeddingList:
        served = await pool.acquire(data.model, EMBEDDING)
        result = await served.encoder.embed(
            data.input, dimensions=data.dimensions, encoding=data.encoding_format
        )
        return EmbeddingList(
            data=[Embedding(i, v) for i, v in enumerate(result.vectors)],
            model=data.model,
            usage=EmbeddingUsage(result.prompt_tokens, result.prompt_tokens),
        )

    @post(
        "/rerank",
        status_code=200,
        operation_id="rerank",
        summary="Documents ranked by relevance to a query, by a rerank model",
        responses=_ERRORS,
    )
    async def rerank(self, data: RerankRequest, pool: ModelPool) -> RerankResponse:
        served = await pool.acquire(data.model, RERANK)
        texts = [d if isinstance(d, str) else d.text for d in data.documents]
        ranked, tokens = await served.encoder.rank(
            data.query, texts, top_n=data.top_n, instruction=data.instruction
        )
        results = [
            RerankResult(
                r.index,
                r.score,
                RerankDocument(text=texts[r.index]) if data.return_documents else UNSET,
            )
            for r in ranked
        ]
        return RerankResponse(
            id=f"rerank-{uuid.uuid4().hex}",
            model=data.model,
            results=results,
            usage=RerankUsage(tokens, tokens),
        )
