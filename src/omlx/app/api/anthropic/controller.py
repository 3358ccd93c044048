"""Anthropic-compatible routes: messages (JSON or SSE events) and token counting."""

from __future__ import annotations

import uuid

from litestar import Controller, Request, post

from omlx.app.api.anthropic.schemas import (
    AnthropicErrorResponse,
    CountTokensRequest,
    Message,
    MessagesRequest,
    OutputBlock,
    TextBlock,
    ThinkingBlock,
    TokenCount,
    ToolUseBlock,
)
from omlx.app.api.anthropic.stream import MessageStream, stop_reason, tool_id, tool_input, usage
from omlx.app.api.cache_edge import note, turn_controls
from omlx.app.api.disconnect import unless_disconnected
from omlx.app.api.openapi import error_responses, streaming_operation
from omlx.app.api.sse import KEEPALIVE_SECONDS, EventStream, opened
from omlx.app.api.translators import Translators
from omlx.app.cache_controls.hints import anthropic_breakpoints
from omlx.app.chat.output import Piece, Reasoning, ToolCallPiece
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.chat.turn import ChatResult, ChatTurn
from omlx.app.models.pool import ModelPool
from omlx.domain.json_values import JsonObject

_ERRORS = error_responses(AnthropicErrorResponse, 400, 401, 404, 413, 429, 500)
CACHE_DIAGNOSIS_BETA = "cache-diagnosis-2026-04-07"


def blocks_of(
    pieces: list[Piece], seal: ReasoningSeal, show_thinking: bool = True
) -> list[OutputBlock]:
    """Pieces as content blocks: runs of text or thinking merged, one block per tool call.

    A thinking block's signature seals its text, so the client can send it back unread.
    """
    blocks: list[OutputBlock] = []
    for piece in pieces:
        if isinstance(piece, ToolCallPiece):
            blocks.append(ToolUseBlock(tool_id(), piece.name, tool_input(piece.arguments)))
        elif isinstance(piece, Reasoning):
            if blocks and isinstance(blocks[-1], ThinkingBlock):
                blocks[-1].thinking += piece.text
            else:
                blocks.append(ThinkingBlock(piece.text))
        elif blocks and isinstance(blocks[-1], TextBlock):
            blocks[-1].text += piece.text
        else:
            blocks.append(TextBlock(piece.text))
    for block in blocks:
        if isinstance(block, ThinkingBlock):
            block.signature = seal.seal(block.thinking)
            if not show_thinking:
                block.thinking = ""
    return blocks or [TextBlock("")]


def message_of(
    mid: str,
    model: str,
    result: ChatResult,
    seal: ReasoningSeal,
    show_thinking: bool,
    written_upto: int = 0,
) -> Message:
    """A whole answer as an Anthropic message; ``written_upto``: see ``stream.usage``."""
    f = result.finished
    return Message(
        id=mid,
        model=model,
        content=blocks_of(result.pieces, seal, show_thinking),
        stop_reason=stop_reason(f.reason, f.stop_sequence, result.tool_calls),  # type: ignore[arg-type]
        stop_sequence=f.stop_sequence,
        usage=usage(f.prompt_tokens, f.completion_tokens, f.cached_tokens, written_upto),
    )


def diagnostics(turn: ChatTurn) -> JsonObject:
    """Anthropic's ``diagnostics`` object for a turn (cache-diagnosis beta)."""
    if turn.previous_named and turn.previous is None:
        return {"cache_miss_reason": {"type": "previous_message_not_found"}}
    d = turn.divergence
    if d is None:
        return {"cache_miss_reason": None}
    return {"cache_miss_reason": {"type": d.reason, "cache_missed_input_tokens": d.missed_tokens}}


def wants_diagnostics(request: Request, data: MessagesRequest) -> bool:
    betas = ",".join(request.headers.getall("anthropic-beta", []))
    return data.diagnostics is not None or CACHE_DIAGNOSIS_BETA in betas


class AnthropicController(Controller):
    path = "/v1/messages"
    tags = ("anthropic",)

    @post(
        status_code=200,
        operation_id="createMessage",
        summary="Anthropic Messages (JSON, or SSE events with stream: true)",
        responses=_ERRORS,
        operation_class=streaming_operation(
            "SSE events: message_start, ping, content_block_start/delta/stop per block, message_delta, message_stop"
        ),
    )
    async def create_message(
        self, data: MessagesRequest, pool: ModelPool, translate: Translators, request: Request
    ) -> Message:
        served = await pool.acquire(data.model)
        chat = translate.anthropic(served.chat).chat_request(data, served.id)
        await translate.read_images(chat)
        breakpoints = anthropic_breakpoints(data, chat.labels)
        controls = turn_controls(
            request, data.omlx_cache_control, breakpoints=breakpoints, metadata=data.metadata
        )
        mid = f"msg_{uuid.uuid4().hex[:24]}"
        previous = data.diagnostics.previous_message_id if data.diagnostics is not None else None
        turn = await served.chat.start(chat, mid, controls, previous)
        turn.on_report = note(request, served.controls, served.id)
        extra = diagnostics(turn) if wants_diagnostics(request, data) else None
        show_thinking = data.thinking is None or data.thinking.display != "omitted"
        if data.stream:
            stream = MessageStream(mid, data.model, translate.seal, show_thinking, extra)
            stream.written_upto = turn.cache_written
            events = await opened(served.chat.stream(turn, KEEPALIVE_SECONDS), request.receive)
            return EventStream(stream.run(events))  # type: ignore[return-value]
        result = await unless_disconnected(request.receive, served.chat.complete(turn))
        seal, written = translate.seal, turn.cache_written
        message = message_of(mid, data.model, result, seal, show_thinking, written)
        if extra is not None:
            message.diagnostics = extra
        return message

    @post(
        "/count_tokens",
        status_code=200,
        operation_id="countMessageTokens",
        summary="Count a request's input tokens",
        responses=_ERRORS,
    )
    async def count_tokens(
        self, data: CountTokensRequest, pool: ModelPool, translate: Translators
    ) -> TokenCount:
        served = await pool.acquire(data.model)
        request = MessagesRequest(
            model=data.model,
            messages=data.messages,
            max_tokens=1,
            system=data.system,
            tools=data.tools,
            tool_choice=data.tool_choice,
            thinking=data.thinking,
            context_management=data.context_management,
        )
        chat = translate.anthropic(served.chat).chat_request(request, served.id)
        await translate.read_images(chat)
        return TokenCount(await served.chat.count_tokens(chat))
