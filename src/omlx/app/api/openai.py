"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Controller, Response, get, post
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from omlx.app.api.errors import APIError, openai_error_body
from omlx.app.api.openai_schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChunkChoice,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    ResponseMessage,
    TextCompletion,
    Usage,
)
from omlx.app.container import Container
from omlx.domain.generation import Failed, Finished, GenerationRequest, PrefillProgress, TextDelta

KEEPALIVE_SECONDS = 5.0
KEEPALIVE = ServerSentEventMessage(data=None, comment="keepalive")


def usage_of(prompt: int, completion: int, cached: int) -> Usage:
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(cached))


def message_to_template(message: ChatMessage) -> dict[str, Any]:
    """A chat message in the dict form chat templates expect; text parts joined."""
    content = message.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.type != "text" or part.text is None:
                raise APIError(400, f"content part type {part.type!r} is not supported; send text", param="messages")
            texts.append(part.text)
        content = "".join(texts)
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role, "content": content or ""}
    if message.name:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [msgspec.to_builtins(c) for c in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def check_model(container: Container, model: str) -> None:
    if model not in container.model_ids:
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves {', '.join(sorted(container.model_ids))}",
            param="model",
            code="model_not_found",
        )


def check_n(n: int | None) -> None:
    if n is not None and n != 1:
        raise APIError(400, "n must be 1: omlx generates one choice per request", param="n")


class OpenAIController(Controller):
    path = "/v1"
    tags = ["openai"]

    @get("/models", operation_id="listModels", summary="List the served models")
    async def list_models(self, container: Container) -> ModelList:
        return ModelList([ModelCard(m, container.started_at) for m in sorted(container.model_ids)])

    @post("/chat/completions", status_code=200, operation_id="createChatCompletion", summary="Chat completion (JSON or SSE)")
    async def chat_completions(self, data: ChatCompletionRequest, container: Container) -> Any:
        check_model(container, data.model)
        check_n(data.n)
        if not data.messages:
            raise APIError(400, "messages must not be empty", param="messages")
        service = container.generation
        messages = [message_to_template(m) for m in data.messages]
        tools = [msgspec.to_builtins(t) for t in data.tools] if data.tools else None
        prompt = await service.render_chat(messages, tools)
        max_tokens = data.max_completion_tokens if data.max_completion_tokens is not None else data.max_tokens
        request = service.build_request(
            prompt,
            max_tokens=max_tokens,
            temperature=data.temperature,
            top_p=data.top_p,
            top_k=data.top_k,
            seed=data.seed,
            stop=data.stop,
            max_tokens_param="max_completion_tokens" if data.max_completion_tokens is not None else "max_tokens",
        )
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if data.stream:
            service.check_capacity()
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            return ServerSentEvent(self._chat_stream(container, request, rid, created, data.model, include_usage))
        result = await service.complete(request)
        return ChatCompletion(
            id=rid,
            created=created,
            model=data.model,
            choices=[Choice(0, ResponseMessage(role="assistant", content=result.text, refusal=None), result.finish_reason)],
            usage=usage_of(result.prompt_tokens, result.completion_tokens, result.cached_tokens),
        )

    async def _chat_stream(
        self, container: Container, request: GenerationRequest, rid: str, created: int, model: str, include_usage: bool
    ) -> AsyncIterator[str]:
        def chunk(delta: Delta, finish: str | None = None, usage: Usage | None = None, choices: bool = True) -> str:
            body = ChatCompletionChunk(
                id=rid,
                created=created,
                model=model,
                choices=[ChunkChoice(0, delta, finish)] if choices else [],
                usage=usage,
            )
            return msgspec.json.encode(body).decode()

        yield chunk(Delta(role="assistant", content=""))
        async for event in keepalive(container.generation.events(request)):
            if event is None:
                yield KEEPALIVE
            elif isinstance(event, TextDelta):
                yield chunk(Delta(content=event.text))
            elif isinstance(event, Finished):
                reason = "length" if event.reason == "length" else "stop"
                usage = usage_of(event.prompt_tokens, event.completion_tokens, event.cached_tokens)
                yield chunk(Delta(), reason, usage=None if include_usage else usage)
                if include_usage:
                    yield chunk(Delta(), usage=usage, choices=False)
            elif isinstance(event, Failed):
                yield msgspec.json.encode(openai_error_body(500, event.message)).decode()
        yield "[DONE]"

    @post("/completions", status_code=200, operation_id="createCompletion", summary="Text completion (JSON or SSE)")
    async def completions(self, data: CompletionRequest, container: Container) -> Any:
        check_model(container, data.model)
        check_n(data.n)
        service = container.generation
        prompt = data.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            if len(prompt) != 1:
                raise APIError(400, "one prompt per request", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "one prompt per request", param="prompt")
            prompt = prompt[0]
        tokens = service.encode_text(prompt) if isinstance(prompt, str) else list(prompt)
        request = service.build_request(
            tokens,
            max_tokens=data.max_tokens if data.max_tokens is not None else 16,
            temperature=data.temperature,
            top_p=data.top_p,
            top_k=data.top_k,
            seed=data.seed,
            stop=data.stop,
        )
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        prefix = prompt if (data.echo and isinstance(prompt, str)) else ""
        if data.stream:
            service.check_capacity()
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            return ServerSentEvent(self._text_stream(container, request, rid, created, data.model, prefix, include_usage))
        result = await service.complete(request)
        return TextCompletion(
            id=rid,
            created=created,
            model=data.model,
            choices=[CompletionChoice(0, prefix + result.text, "length" if result.finish_reason == "length" else "stop")],
            usage=usage_of(result.prompt_tokens, result.completion_tokens, result.cached_tokens),
        )

    async def _text_stream(
        self, container: Container, request: GenerationRequest, rid: str, created: int, model: str, prefix: str, include_usage: bool
    ) -> AsyncIterator[str]:
        def chunk(text: str, finish: str | None = None, usage: Usage | None = None) -> str:
            body = TextCompletion(id=rid, created=created, model=model, choices=[CompletionChoice(0, text, finish)], usage=usage)
            return msgspec.json.encode(body).decode()

        if prefix:
            yield chunk(prefix)
        async for event in keepalive(container.generation.events(request)):
            if event is None:
                yield KEEPALIVE
            elif isinstance(event, TextDelta):
                yield chunk(event.text)
            elif isinstance(event, Finished):
                usage = usage_of(event.prompt_tokens, event.completion_tokens, event.cached_tokens)
                yield chunk("", "length" if event.reason == "length" else "stop", usage if include_usage else None)
            elif isinstance(event, Failed):
                yield msgspec.json.encode(openai_error_body(500, event.message)).decode()
        yield "[DONE]"


async def keepalive(events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Pass events through, dropping prefill progress; ``None`` after quiet spells (SSE comments)."""
    iterator = events.__aiter__()
    pending = asyncio.ensure_future(iterator.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_SECONDS)
            if not done:
                yield None
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            pending = asyncio.ensure_future(iterator.__anext__())
            if not isinstance(event, PrefillProgress):
                yield event
    finally:
        pending.cancel()
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
