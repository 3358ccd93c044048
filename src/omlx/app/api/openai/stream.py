"""OpenAI stream bodies: chat completion chunks and text completion chunks as SSE data."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import msgspec
from litestar.response.sse import ServerSentEventMessage

from omlx.app.api.errors import openai_error_body, status_of
from omlx.app.api.openai.logprobs import TokenText, chat_logprobs, completion_logprobs
from omlx.app.api.openai.schemas import (
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChunkChoice,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    PromptTokensDetails,
    TextCompletion,
    ToolCallDelta,
    ToolCallFunctionDelta,
    Usage,
    encode,
)
from omlx.app.api.sse import KEEPALIVE, KEEPALIVE_SECONDS
from omlx.app.chat.output import (
    Content,
    Piece,
    Reasoning,
    ToolCallArgs,
    ToolCallPiece,
    ToolCallStart,
)
from omlx.app.chat.pipeline import ChatEvent, Done, Error, Output
from omlx.app.errors import AppError
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


def _refusal_event(exc: AppError) -> str:
    """A refusal after the stream began (the server stopping): its own status and code."""
    return msgspec.json.encode(
        openai_error_body(status_of(exc), exc.message, exc.param, exc.code)
    ).decode()


class ChatStream:
    """One chat completion's SSE chunks; an error after the start is a final data event.

    With ``token_text`` (the request asked for logprobs), each event's log-probabilities
    ride on its first chunk, or on a chunk of their own when it has no text.
    """

    def __init__(
        self,
        rid: str,
        created: int,
        model: str,
        include_usage: bool,
        token_text: TokenText | None = None,
    ) -> None:
        self.rid, self.created, self.model, self.include_usage = rid, created, model, include_usage
        self.token_text = token_text
        self.calls = 0

    def chunk(
        self,
        delta: Delta,
        finish: str | None = None,
        usage: Usage | None = None,
        choices: bool = True,
        logprobs: ChoiceLogprobs | None = None,
    ) -> str:
        choice = [ChunkChoice(0, delta, finish, logprobs)] if choices else []
        return encode(
            ChatCompletionChunk(
                id=self.rid, created=self.created, model=self.model, choices=choice, usage=usage
            )
        )

    def piece(self, piece: Piece, logprobs: ChoiceLogprobs | None = None) -> str | None:
        """The chunk of one piece; None for a call its fragments already carried."""
        if isinstance(piece, Content):
            return self.chunk(Delta(content=piece.text), logprobs=logprobs)
        if isinstance(piece, Reasoning):
            return self.chunk(Delta(reasoning_content=piece.text), logprobs=logprobs)
        if isinstance(piece, ToolCallStart):
            # The first chunk of a call: its id and name, then its arguments as deltas.
            self.calls += 1
            first = ToolCallDelta(
                piece.index, call_id(), "function", ToolCallFunctionDelta(piece.name, "")
            )
            return self.chunk(Delta(tool_calls=[first]), logprobs=logprobs)
        if isinstance(piece, ToolCallArgs):
            fragment = ToolCallDelta(
                piece.index, function=ToolCallFunctionDelta(arguments=piece.text)
            )
            return self.chunk(Delta(tool_calls=[fragment]), logprobs=logprobs)
        assert isinstance(piece, ToolCallPiece)
        if piece.streamed:
            return None
        call = ToolCallDelta(
            piece.index, call_id(), "function", ToolCallFunctionDelta(piece.name, piece.arguments)
        )
        self.calls += 1
        return self.chunk(Delta(tool_calls=[call]), logprobs=logprobs)

    def output(self, event: Output) -> list[str]:
        logprobs = None
        if self.token_text is not None and event.logprobs:
            logprobs = chat_logprobs(event.logprobs, self.token_text)
        chunks = []
        for p in event.pieces:
            chunk = self.piece(p, logprobs)
            if chunk is not None:
                chunks.append(chunk)
                logprobs = None
        if logprobs:
            chunks.append(self.chunk(Delta(), logprobs=logprobs))
        return chunks

    async def run(
        self, events: AsyncIterator[ChatEvent | None]
    ) -> AsyncIterator[str | ServerSentEventMessage]:
        try:
            yield self.chunk(Delta(role="assistant", content=""))
            async for event in events:
                if event is None:
                    yield KEEPALIVE
                elif isinstance(event, Output):
                    for chunk in self.output(event):
                        yield chunk
                elif isinstance(event, Done):
                    for piece in event.pieces:
                        if (chunk := self.piece(piece)) is not None:
                            yield chunk
                    f = event.finished
                    usage = usage_of(f.prompt_tokens, f.completion_tokens, f.cached_tokens)
                    reason = chat_finish_reason(f.reason, self.calls)
                    yield self.chunk(Delta(), reason, usage=None if self.include_usage else usage)
                    if self.include_usage:
                        yield self.chunk(Delta(), usage=usage, choices=False)
                elif isinstance(event, Error):
                    yield _error_event(event.message)
        except AppError as exc:  # a refusal after the start (the server stopping): no traceback
            yield _refusal_event(exc)
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
    token_text: TokenText | None = None,
) -> AsyncIterator[str | ServerSentEventMessage]:
    offset = len(prefix)

    def chunk(
        text: str,
        finish: str | None = None,
        usage: Usage | None = None,
        logprobs: CompletionLogprobs | None = None,
    ) -> str:
        choices = [CompletionChoice(0, text, finish, logprobs)]
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
                logprobs = None
                if token_text is not None:
                    logprobs = completion_logprobs(event.logprobs, token_text, offset)
                    offset += sum(len(t) for t in logprobs.tokens)
                yield chunk(event.text, logprobs=logprobs)
            elif isinstance(event, Finished):
                usage = usage_of(event.prompt_tokens, event.completion_tokens, event.cached_tokens)
                yield chunk(
                    "",
                    "length" if event.reason == "length" else "stop",
                    usage if include_usage else None,
                )
            elif isinstance(event, Failed):
                yield _error_event(event.message)
    except AppError as exc:
        yield _refusal_event(exc)
    except Exception as exc:
        log.exception("completion stream failed")
        yield _error_event(f"internal error: {exc}")
    yield "[DONE]"
