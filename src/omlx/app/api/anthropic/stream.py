"""Anthropic stream bodies: the named SSE events of one message, and usage and stop reasons."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator

import msgspec
from litestar.response.sse import ServerSentEventMessage

from omlx.app.api.anthropic.schemas import MessageUsage
from omlx.app.api.errors import anthropic_error_body, status_of
from omlx.app.api.sse import KEEPALIVE
from omlx.app.chat.output import (
    Content,
    Piece,
    Reasoning,
    ToolCallArgs,
    ToolCallPiece,
    ToolCallStart,
)
from omlx.app.chat.pipeline import ChatEvent, Done, Error, Output, Started
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.chat.tool_calls import close_partial
from omlx.app.errors import AppError
from omlx.domain.json_values import JsonObject

log = logging.getLogger(__name__)


def tool_input(arguments: str) -> JsonObject:
    """A call's arguments as ``tool_use.input``; cut ones (``max_tokens``) as far as they got."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = close_partial(arguments)
        if value is None:
            value = {} if not arguments.strip() else arguments
    return value if isinstance(value, dict) else {"arguments": value}


def usage(prompt: int, completion: int, cached: int, written_upto: int = 0) -> MessageUsage:
    """Anthropic's token accounting: ``input + cache_creation + cache_read == prompt``.

    ``written_upto``: the prompt offset of the request's last ``cache_control`` breakpoint;
    the new tokens before it count as written to the cache, as Anthropic counts them (omlx
    keeps the rest too, automatically, reported as ``input_tokens``).
    """
    written = max(min(written_upto, prompt) - cached, 0)
    return MessageUsage(
        input_tokens=prompt - cached - written,
        output_tokens=completion,
        cache_read_input_tokens=cached,
        cache_creation_input_tokens=written,
    )


def stop_reason(reason: str, stop_sequence: str | None, tool_calls: int) -> str:
    if reason == "length":
        return "max_tokens"
    if tool_calls:
        return "tool_use"
    return "stop_sequence" if stop_sequence else "end_turn"


def tool_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def _event(name: str, body: JsonObject) -> ServerSentEventMessage:
    return ServerSentEventMessage(event=name, data=msgspec.json.encode(body).decode())


class MessageStream:
    """Anthropic's event sequence for one message; an error after the start is an ``error`` event.

    A thinking block ends with a ``signature_delta`` sealing its text (``sealing``); with
    ``show_thinking`` off (``display: omitted``) that is all the client gets of it.
    """

    def __init__(
        self,
        mid: str,
        model: str,
        seal: ReasoningSeal,
        show_thinking: bool = True,
        diagnostics: JsonObject | None = None,
    ) -> None:
        self.mid, self.model = mid, model
        self.seal, self.show_thinking, self.diagnostics = seal, show_thinking, diagnostics
        self.index = -1
        self.open: str | None = None  # the kind of the open block: "text" | "thinking" | "tool_use"
        self.thinking: list[str] = []  # the open thinking block's text, sealed at its end
        self.started = False
        self.calls = 0
        self.written_upto = 0  # the last cache_control breakpoint's offset (``usage``)

    def start(self, prompt: int, cached: int) -> list[ServerSentEventMessage]:
        self.started = True
        message = {
            "id": self.mid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": msgspec.to_builtins(usage(prompt, 0, cached, self.written_upto)),
        }
        if self.diagnostics is not None:
            message["diagnostics"] = self.diagnostics
        return [
            _event("message_start", {"type": "message_start", "message": message}),
            _event("ping", {"type": "ping"}),
        ]

    def close(self) -> list[ServerSentEventMessage]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            signature = self.seal.seal("".join(self.thinking))
            events.append(self.delta({"type": "signature_delta", "signature": signature}))
            self.thinking = []
        self.open = None
        events.append(
            _event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        )
        return events

    def begin(self, block: JsonObject) -> list[ServerSentEventMessage]:
        events = self.close()
        self.index += 1
        self.open = block["type"]
        events.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return events

    def delta(self, delta: JsonObject) -> ServerSentEventMessage:
        return _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def piece(self, piece: Piece) -> list[ServerSentEventMessage]:
        if isinstance(piece, Content):
            events = [] if self.open == "text" else self.begin({"type": "text", "text": ""})
            return [*events, self.delta({"type": "text_delta", "text": piece.text})]
        if isinstance(piece, Reasoning):
            events = (
                []
                if self.open == "thinking"
                else self.begin({"type": "thinking", "thinking": "", "signature": ""})
            )
            self.thinking.append(piece.text)
            if self.show_thinking:
                events.append(self.delta({"type": "thinking_delta", "thinking": piece.text}))
            return events
        if isinstance(piece, ToolCallStart):  # its arguments follow as input_json_delta
            self.calls += 1
            return self.begin(
                {"type": "tool_use", "id": tool_id(), "name": piece.name, "input": {}}
            )
        if isinstance(piece, ToolCallArgs):
            return [self.delta({"type": "input_json_delta", "partial_json": piece.text})]
        assert isinstance(piece, ToolCallPiece)
        if piece.streamed:
            return self.close()
        self.calls += 1
        events = self.begin({"type": "tool_use", "id": tool_id(), "name": piece.name, "input": {}})
        events.append(
            self.delta(
                {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(tool_input(piece.arguments)),
                }
            )
        )
        return [*events, *self.close()]

    def finish(self, done: Done) -> list[ServerSentEventMessage]:
        event = done.finished
        events = [] if self.started else self.start(event.prompt_tokens, event.cached_tokens)
        for piece in done.pieces:
            events += self.piece(piece)
        if self.index < 0:  # clients expect at least one block
            events += self.begin({"type": "text", "text": ""})
        events += self.close()
        sequence = event.stop_sequence
        delta = {
            "stop_reason": stop_reason(event.reason, sequence, self.calls),
            "stop_sequence": sequence,
        }
        body = {
            "type": "message_delta",
            "delta": delta,
            "usage": msgspec.to_builtins(
                usage(
                    event.prompt_tokens,
                    event.completion_tokens,
                    event.cached_tokens,
                    self.written_upto,
                )
            ),
        }
        return [
            *events,
            _event("message_delta", body),
            _event("message_stop", {"type": "message_stop"}),
        ]

    async def run(
        self, events: AsyncIterator[ChatEvent | None]
    ) -> AsyncIterator[ServerSentEventMessage]:
        try:
            async for event in events:
                if event is None:
                    # Before message_start only a comment may be sent; after it, Anthropic pings.
                    yield _event("ping", {"type": "ping"}) if self.started else KEEPALIVE
                elif isinstance(event, Started):
                    for e in self.start(event.prompt_tokens, event.cached_tokens):
                        yield e
                elif isinstance(event, Output):
                    for piece in event.pieces:
                        for e in self.piece(piece):
                            yield e
                elif isinstance(event, Done):
                    for e in self.finish(event):
                        yield e
                elif isinstance(event, Error):
                    yield _event("error", anthropic_error_body(500, event.message))
        except AppError as exc:  # a refusal after the start (the server stopping): no traceback
            yield _event("error", anthropic_error_body(status_of(exc), exc.message))
        except Exception as exc:  # after the 200 went out, an error is the stream's last event
            log.exception("message stream failed")
            yield _event("error", anthropic_error_body(500, f"internal error: {exc}"))
