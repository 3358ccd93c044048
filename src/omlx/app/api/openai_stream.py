"""OpenAI stream bodies: chat completion chunks and text completion chunks as SSE data."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import msgspec
from litestar.response.sse import ServerSentEventMessage

from omlx.app.api.errors import openai_error_body
from omlx.app.api.openai_schemas import (
    ChatCompletionChunk,
    ChunkChoice,
    CompletionChoice,
    Delta,
    PromptTokensDetails,
    TextCompletion,
    ToolCallDelta,
    ToolCallFunctionDelta,
    Usage,
    encode,
)
from omlx.app.api.sse import KEEPALIVE, KEEPALIVE_SECONDS
from omlx.app.chat import ChatEvent, Done, Error, Output
from omlx.app.output import Content, Piece, Reasoning, ToolCallPiece
from omlx.domain.generation import Failed, Finished, GenerationEvent, TextDelta

log = logging.getLogger(__name__)

__all__ = ["KEEPALIVE_SECONDS", "ChatStream", "text_stream"]


def usage_of(prompt: int, completion: int, cached: int) -> Usage:
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(cached))


def chat_finish_reason(reason: str, tool_calls: int) -> str:
    if reason == "length":
        return "length"
    return "tool_calls" if tool_calls else "stop"


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _error_event(message: str) -> str:
    return msgspec.json.encode(openai_error_body(500, message)).decode()


class ChatStream:
    """One chat completion's SSE chunks; an error after the start is a final data event."""

    def __init__(self, rid: str, created: int, model: str, include_usage: bool) -> None:
        self.rid, self.created, self.model, self.include_usage = rid, created, model, include_usage
        self.calls = 0

    def chunk(
        self,
        delta: Delta,
        finish: str | None = None,
        usage: Usage | None = None,
        choices: bool = True,
    ) -> str:
        choice = [ChunkChoice(0, delta, finish)] if choices else []
        return encode(
            ChatCompletionChunk(
                id=self.rid, created=self.created, model=self.model, choices=choice, usage=usage
            )
        )

    def piece(self, piece: Piece) -> str:
        if isinstance(piece, Content):
            return self.chunk(Delta(content=piece.text))
        if isinstance(piece, Reasoning):
            return self.chunk(Delta(reasoning_content=piece.text))
        assert isinstance(piece, ToolCallPiece)
        call = ToolCallDelta(
            self.calls, call_id(), "function", ToolCallFunctionDelta(piece.name, piece.arguments)
        )
        self.calls += 1
        return self.chunk(Delta(tool_calls=[call]))

    async def run(
        self, events: AsyncIterator[ChatEvent | None]
    ) -> AsyncIterator[str | ServerSentEventMessage]:
        try:
            yield self.chunk(Delta(role="assistant", content=""))
            async for event in events:
                if event is None:
                    yield KEEPALIVE
                elif isinstance(event, Output):
                    for piece in event.pieces:
                        yield self.piece(piece)
                elif isinstance(event, Done):
                    for piece in event.pieces:
                        yield self.piece(piece)
                    f = event.finished
                    usage = usage_of(f.prompt_tokens, f.completion_tokens, f.cached_tokens)
                    reason = chat_finish_reason(f.reason, self.calls)
                    yield self.chunk(Delta(), reason, usage=None if self.include_usage else usage)
                    if self.include_usage:
                        yield self.chunk(Delta(), usage=usage, choices=False)
                elif isinstance(event, Error):
                    yield _error_event(event.message)
        except Exception as exc:  # after the 200 went out, an error is the stream's last event
            log.exception("chat stream failed")
            yield _error_event(f"internal error: {exc}")
        yield "[DONE]"


async def text_stream(
    events: AsyncIterator[GenerationEvent | None],
    rid: str,
    created: int,
    model: str,
    prefix: str,
    include_usage: bool,
) -> AsyncIterator[str | ServerSentEventMessage]:
    def chunk(text: str, finish: str | None = None, usage: Usage | None = None) -> str:
        choices = [CompletionChoice(0, text, finish)]
        return encode(
            TextCompletion(
                id=rid, created=created, model=model, choices=choices, usage=usage or msgspec.UNSET
            )
        )

    try:
        if prefix:
            yield chunk(prefix)
        async for event in events:
            if event is None:
                yield KEEPALIVE
            elif isinstance(event, TextDelta):
                yield chunk(event.text)
            elif isinstance(event, Finished):
                usage = usage_of(event.prompt_tokens, event.completion_tokens, event.cached_tokens)
                yield chunk(
                    "",
                    "length" if event.reason == "length" else "stop",
                    usage if include_usage else None,
                )
            elif isinstance(event, Failed):
                yield _error_event(event.message)
    except Exception as exc:
        log.exception("completion stream failed")
        yield _error_event(f"internal error: {exc}")
    yield "[DONE]"
