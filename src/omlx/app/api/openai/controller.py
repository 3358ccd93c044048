"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import time
import uuid

import anyio
import msgspec
from litestar import Controller, Request, get, post

from omlx.app.api.cache_edge import note, turn_controls
from omlx.app.api.disconnect import unless_disconnected
from omlx.app.api.openai.answers import chat_completion, text_completion
from omlx.app.api.openai.params import completion_sampling
from omlx.app.api.openai.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    OpenAIErrorResponse,
    TextCompletion,
)
from omlx.app.api.openai.stream import KEEPALIVE_SECONDS, ChatStream, text_stream
from omlx.app.api.openapi import error_responses, streaming_operation
from omlx.app.api.sse import EventStream, opened
from omlx.app.api.translators import Translators
from omlx.app.cache_controls.hints import openai_retention
from omlx.app.cache_controls.report import CacheReport
from omlx.app.cache_controls.reporting import reported
from omlx.app.errors import InvalidRequest
from omlx.app.models.pool import ModelPool
from omlx.domain.generation import PrefillStarted

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
    async def list_models(self, pool: ModelPool, started_at: int) -> ModelList:
        names = pool.names
        cards = [
            ModelCard(
                m,
                started_at,
                aliases=names.aliases_of(m) or msgspec.UNSET,
                state=pool.state(m),
                task=pool.specs[m].task,
                context_length=pool.context_length(m) or msgspec.UNSET,
            )
            for m in names.served
        ]
        cards += [
            ModelCard(a.name, started_at, alias_of=a.target) for a in names.aliases if not a.is_glob
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
        self, data: ChatCompletionRequest, pool: ModelPool, translate: Translators, request: Request
    ) -> ChatCompletion:
        check_n(data.n)
        served = await pool.acquire(data.model)
        chat = await translate.read_images(translate.openai(data, served.id, served.chat))
        controls = turn_controls(
            request,
            data.omlx_cache_control,
            retention=openai_retention(data.prompt_cache_retention),
            session_key=data.prompt_cache_key,
        )
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        turn = await served.chat.start(chat, rid, controls)
        turn.on_report = note(request, served.controls, served.id)
        token_text = served.generation.token_text if chat.sampling.logprobs is not None else None
        if data.stream:
            usage = bool(data.stream_options and data.stream_options.include_usage)
            stream = ChatStream(rid, created, data.model, usage, token_text)
            events = await opened(served.chat.stream(turn, KEEPALIVE_SECONDS), request.receive)
            return EventStream(stream.run(events))  # type: ignore[return-value]
        result = await unless_disconnected(request.receive, served.chat.complete(turn))
        return chat_completion(rid, created, data.model, result, token_text)

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
        self, data: CompletionRequest, pool: ModelPool, request: Request
    ) -> TextCompletion:
        check_n(data.n)
        served = await pool.acquire(data.model)
        service, controls = served.generation, served.controls
        prompt = _one_prompt(data.prompt)
        tokens = prompt
        if isinstance(prompt, str):
            tokens = await anyio.to_thread.run_sync(service.encode_text, prompt, "prompt")
        gen = service.build_request(tokens, completion_sampling(data))
        edge = turn_controls(request, data.omlx_cache_control)
        found = await anyio.to_thread.run_sync(controls.look, tokens, edge.tenant)
        gen = controls.apply(gen, edge, found)
        events = service.stream(gen, KEEPALIVE_SECONDS if data.stream else None)
        noted = note(request, controls, served.id)
        if noted is not None:  # the report: what the engine restored, before the response starts

            def made(started: PrefillStarted) -> CacheReport | None:
                restored = controls.restored(started)
                made = controls.report(restored, tokens, store=edge.store, session=edge.session)
                return served.chat.reports.counted(made) if made is not None else None

            events = reported(events, made, noted)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        prefix = prompt if (data.echo and isinstance(prompt, str)) else ""
        token_text = service.token_text if gen.logprobs is not None else None
        if data.stream:
            usage = bool(data.stream_options and data.stream_options.include_usage)
            events = await opened(events, request.receive)
            return EventStream(
                text_stream(events, rid, created, data.model, prefix, usage, token_text)
            )  # type: ignore[return-value]
        result = await unless_disconnected(request.receive, service.collect(events))
        return text_completion(rid, created, data.model, result, prefix, token_text)


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
