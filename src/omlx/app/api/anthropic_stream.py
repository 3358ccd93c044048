"""Anthropic stream bodies: the named SSE events of one message, and usage and stop reasons."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar.response.sse import ServerSentEventMessage

from omlx.app.api.anthropic_schemas import MessageUsage
from omlx.app.api.errors import anthropic_error_body
from omlx.app.api.output import Content, OutputSplitter, Piece, Reasoning
from omlx.app.api.sse import KEEPALIVE
from omlx.app.container import Container
from omlx.app.generation import stop_sequence_of
from omlx.domain.generation import Failed, Finished, GenerationRequest, PrefillStarted, TextDelta

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 5.0


def tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = arguments
    return value if isinstance(value, dict) else {"arguments": value}


def usage(prompt: int, completion: int, cached: int) -> MessageUsage:
    return MessageUsage(
        input_tokens=prompt - cached, output_tokens=completion, cache_read_input_tokens=cached
    )


def stop_reason(reason: str, stop_sequence: str | None, tool_calls: int) -> str:
    if reason == "length":
        return "max_tokens"
    if tool_calls:
        return "tool_use"
    return "stop_sequence" if stop_sequence else "end_turn"


def tool_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def _event(name: str, body: dict[str, Any]) -> ServerSentEventMessage:
    return ServerSentEventMessage(event=name, data=msgspec.json.encode(body).decode())


class MessageStream:
    """Anthropic's event sequence for one message; an error after the start is an ``error`` event."""

    def __init__(self, mid: str, model: str) -> None:
        self.mid, self.model = mid, model
        self.index = -1
        self.open: str | None = None  # the kind of the open block: "text" | "thinking"
        self.started = False
        self.calls = 0

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
            "usage": msgspec.to_builtins(usage(prompt, 0, cached)),
        }
        return [
            _event("message_start", {"type": "message_start", "message": message}),
            _event("ping", {"type": "ping"}),
        ]

    def close(self) -> list[ServerSentEventMessage]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def begin(self, block: dict[str, Any]) -> list[ServerSentEventMessage]:
        events = self.close()
        self.index += 1
        self.open = block["type"] if block["type"] in ("text", "thinking") else None
        events.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return events

    def delta(self, delta: dict[str, Any]) -> ServerSentEventMessage:
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
            return [*events, self.delta({"type": "thinking_delta", "thinking": piece.text})]
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
        events.append(
            _event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        )
        return events

    def finish(self, event: Finished, splitter: OutputSplitter) -> list[ServerSentEventMessage]:
        events = [] if self.started else self.start(event.prompt_tokens, event.cached_tokens)
        for piece in splitter.finish():
            events += self.piece(piece)
        if self.index < 0:  # clients expect at least one block
            events += self.begin({"type": "text", "text": ""})
        events += self.close()
        sequence = stop_sequence_of(event)
        delta = {
            "stop_reason": stop_reason(event.reason, sequence, self.calls),
            "stop_sequence": sequence,
        }
        body = {
            "type": "message_delta",
            "delta": delta,
            "usage": msgspec.to_builtins(
                usage(event.prompt_tokens, event.completion_tokens, event.cached_tokens)
            ),
        }
        return [
            *events,
            _event("message_delta", body),
            _event("message_stop", {"type": "message_stop"}),
        ]

    async def run(
        self, container: Container, gen: GenerationRequest, splitter: OutputSplitter
    ) -> AsyncIterator[ServerSentEventMessage]:
        try:
            async for event in container.generation.events(gen, KEEPALIVE_SECONDS):
                if event is None:
                    # Before message_start only a comment may be sent; after it, Anthropic pings.
                    yield _event("ping", {"type": "ping"}) if self.started else KEEPALIVE
                elif isinstance(event, PrefillStarted):
                    for e in self.start(event.prompt_tokens, event.cached_tokens):
                        yield e
                elif isinstance(event, TextDelta):
                    for piece in splitter.feed(event.text):
                        for e in self.piece(piece):
                            yield e
                elif isinstance(event, Finished):
                    for e in self.finish(event, splitter):
                        yield e
                elif isinstance(event, Failed):
                    yield _event("error", anthropic_error_body(500, event.message))
        except Exception as exc:  # after the 200 went out, an error is the stream's last event
            log.exception("message stream failed")
            yield _event("error", anthropic_error_body(500, f"internal error: {exc}"))
