"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import time
import uuid

import anyio
import msgspec
from litestar import Controller, Request, get, post

from omlx.app.api.auth import tenant_of
from omlx.app.api.cache_edge import note, note_tokens, with_controls
from omlx.app.api.disconnect import unless_disconnected
from omlx.app.api.openai.logprobs import chat_logprobs, completion_logprobs
from omlx.app.api.openai.params import completion_sampling
from omlx.app.api.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    OpenAIErrorResponse,
    ResponseMessage,
    TextCompletion,
    ToolCall,
    ToolCallFunction,
)
from omlx.app.api.openai.stream import (
    KEEPALIVE_SECONDS,
    ChatStream,
    call_id,
    chat_finish_reason,
    text_stream,
    usage_of,
)
from omlx.app.api.openai.translate import chat_request
from omlx.app.api.openapi import error_responses, streaming_operation
from omlx.app.api.sse import EventStream
from omlx.app.cache_controls.hints import (
    honour_retention,
    openai_retention,
    remember_session,
    session_turn,
)
from omlx.app.chat.output import collect
from omlx.app.errors import InvalidRequest
from omlx.app.wiring.container import Container

_ERRORS = error_responses(OpenAIErrorResponse, 400, 401, 404, 413, 429, 500)


def check_n(n: int | None) -> None:
    if n is not None and n != 1:
        raise InvalidRequest("n must be 1: omlx generates one choice per request", param="n")


class OpenAIController(Controller):
    path = "/v1"
    tags = ("openai",)

    @get(
        "/models",
        operation_id="listModels",
        summary="List the served models",
        responses=error_responses(OpenAIErrorResponse, 401),
    )
    async def list_models(self, container: Container) -> ModelList:
        names, pool = container.names, container.pool
        cards = [
            ModelCard(
                m,
                container.started_at,
                aliases=names.aliases_of(m) or msgspec.UNSET,
                state=pool.state(m),
                task=pool.specs[m].task,
            )
            for m in names.served
        ]
        cards += [
            ModelCard(a.name, container.started_at, alias_of=a.target)
            for a in names.aliases
            if not a.is_glob
        ]
        return ModelList(cards)

    @post(
        "/chat/completions",
        status_code=200,
        operation_id="createChatCompletion",
        summary="Chat completion (JSON, or SSE chunks with stream: true)",
        responses=_ERRORS,
        operation_class=streaming_operation(
            "chat.completion.chunk JSON objects as SSE data lines, then data: [DONE]"
        ),
    )
    async def chat_completions(
        self, data: ChatCompletionRequest, container: Container, request: Request
    ) -> ChatCompletion:
        check_n(data.n)
        served = await container.pool.acquire(data.model)
        chat = chat_request(
            data,
            served.id,
            container.normalizer,
            effort_kwarg=served.chat.renderer.accepts_reasoning_effort,
        )
        retention = openai_retention(data.prompt_cache_retention)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        group = data.prompt_cache_key
        chat.cache_tenant = tenant_of(request)
        turn = await served.chat.prepare(chat, rid, session_turn(served, group))
        remember_session(served, group, turn)
        turn.request = with_controls(request, data.omlx_cache_control, turn.request)
        note(request, turn.cache, stored=turn.request.cache_store, model=served.id)
        if turn.request.cache_store:
            await honour_retention(served, turn.prompt.tokens, retention, group, chat.cache_tenant)
        token_text = served.generation.token_text if chat.sampling.logprobs is not None else None
        if data.stream:
            events = served.chat.stream(turn, KEEPALIVE_SECONDS)
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            stream = ChatStream(rid, created, data.model, include_usage, token_text)
            return EventStream(stream.run(events))  # type: ignore[return-value]
        result = await unless_disconnected(request.receive, served.chat.complete(turn))
        text, reasoning, calls = collect(result.pieces)
        message = ResponseMessage(
            role="assistant",
            content=text if text or not calls else None,
            refusal=None,
            tool_calls=[
                ToolCall(
                    id=call_id(), function=ToolCallFunction(name=c.name, arguments=c.arguments)
                )
                for c in calls
            ]
            or None,
            reasoning_content=reasoning or None,
        )
        f = result.finished
        return ChatCompletion(
            id=rid,
            created=created,
            model=data.model,
            choices=[
                Choice(
                    0,
                    message,
                    chat_finish_reason(f.reason, len(calls)),
                    chat_logprobs(result.logprobs, token_text) if token_text else None,
                )
            ],
            usage=usage_of(f.prompt_tokens, f.completion_tokens, f.cached_tokens),
        )

    @post(
        "/completions",
        status_code=200,
        operation_id="createCompletion",
        summary="Text completion of a string or token ids (JSON, or SSE with stream: true)",
        responses=_ERRORS,
        operation_class=streaming_operation(
            "text_completion JSON objects as SSE data lines, then data: [DONE]"
        ),
    )
    async def completions(
        self, data: CompletionRequest, container: Container, request: Request
    ) -> TextCompletion:
        check_n(data.n)
        served = await container.pool.acquire(data.model)
        service = served.generation
        prompt = _one_prompt(data.prompt)
        tokens = (
            await anyio.to_thread.run_sync(service.encode_text, prompt, "prompt")
            if isinstance(prompt, str)
            else prompt
        )
        gen = service.build_request(tokens, completion_sampling(data))
        gen = with_controls(request, data.omlx_cache_control, gen)
        await note_tokens(request, served, tokens, stored=gen.cache_store)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        prefix = prompt if (data.echo and isinstance(prompt, str)) else ""
        token_text = service.token_text if gen.logprobs is not None else None
        if data.stream:
            events = service.stream(gen, KEEPALIVE_SECONDS)
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            return EventStream(
                text_stream(events, rid, created, data.model, prefix, include_usage, token_text)
            )  # type: ignore[return-value]
        result = await unless_disconnected(request.receive, service.complete(gen))
        return TextCompletion(
            id=rid,
            created=created,
            model=data.model,
            choices=[
                CompletionChoice(
                    0,
                    prefix + result.text,
                    "length" if result.finish_reason == "length" else "stop",
                    completion_logprobs(result.logprobs, token_text) if token_text else None,
                )
            ],
            usage=usage_of(result.prompt_tokens, result.completion_tokens, result.cached_tokens),
        )


def _one_prompt(prompt: str | list) -> str | list[int]:
    """The one prompt of a request: a string, token ids, or a batch of exactly one of either."""
    if isinstance(prompt, str):
        return prompt
    if prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if len(prompt) == 1 and (
        isinstance(prompt[0], str) or (prompt[0] and all(isinstance(t, int) for t in prompt[0]))
    ):
        return prompt[0] if isinstance(prompt[0], str) else list(prompt[0])
    if len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt):
        raise InvalidRequest("one prompt per request", param="prompt")
    raise InvalidRequest(
        "prompt must be a string, a list of token ids, or a one-item list of either",
        param="prompt",
    )
