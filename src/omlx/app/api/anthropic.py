"""Anthropic-compatible routes: messages (JSON or SSE events) and token counting."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, post

from omlx.app.api.anthropic_schemas import (
    AnthropicErrorResponse,
    CountTokensRequest,
    InputBlock,
    Message,
    MessagesRequest,
    OutputBlock,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    TokenCount,
    ToolChoice,
    ToolParam,
    ToolUseBlock,
)
from omlx.app.api.anthropic_stream import MessageStream, stop_reason, tool_id, tool_input, usage
from omlx.app.api.checks import check_model
from omlx.app.api.errors import APIError
from omlx.app.api.openapi import error_responses, streaming_operation
from omlx.app.api.output import OutputFormat, OutputSplitter, Piece, Reasoning, ToolCallPiece
from omlx.app.api.sse import EventStream
from omlx.app.container import Container
from omlx.app.generation import Completion, unless_disconnected

_ERRORS = error_responses(AnthropicErrorResponse, 400, 401, 404, 413, 429, 500)
_IGNORED_BLOCKS = {"thinking", "redacted_thinking"}


def _system_text(system: str | list[SystemBlock] | None) -> str:
    if isinstance(system, list):
        return "\n\n".join(b.text for b in system if b.type == "text")
    return system or ""


def _result_text(block: InputBlock) -> str:
    content = block.content
    if isinstance(content, list):
        parts = []
        for part in content:
            if part.type != "text":
                raise APIError(
                    400, f"tool_result content of type {part.type!r} is not supported; send text"
                )
            parts.append(part.text or "")
        content = "\n".join(parts)
    return content or ""


def messages_to_template(
    system: str | list[SystemBlock] | None, messages: list
) -> list[dict[str, Any]]:
    """Anthropic messages as chat-template dicts: tool_use -> tool_calls, tool_result -> role tool."""
    out: list[dict[str, Any]] = []
    if text := _system_text(system):
        out.append({"role": "system", "content": text})
    for message in messages:
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
        elif message.role == "assistant":
            out.append(_assistant_to_template(message.content))
        else:
            out.extend(_user_to_template(message.content))
    return out


def _assistant_to_template(blocks: list[InputBlock]) -> dict[str, Any]:
    texts, thinking, calls = [], [], []
    for block in blocks:
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "thinking":
            thinking.append(block.thinking or "")
        elif block.type == "tool_use":
            if not block.id or not block.name:
                raise APIError(400, "a tool_use block needs an id and a name")
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": block.input or {}},
                }
            )
        elif block.type not in _IGNORED_BLOCKS:
            raise APIError(
                400, f"assistant content blocks of type {block.type!r} are not supported"
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    return out


def _user_to_template(blocks: list[InputBlock]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in blocks:
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            content = _result_text(block)
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id or "",
                    "content": ("Error: " + content) if block.is_error else content,
                }
            )
        elif block.type not in _IGNORED_BLOCKS:
            raise APIError(
                400, f"user content blocks of type {block.type!r} are not supported; send text"
            )
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def tools_to_template(tools: list[ToolParam] | None) -> list[dict] | None:
    if not tools:
        return None
    out = []
    for tool in tools:
        if tool.type not in (None, "custom"):
            raise APIError(
                400, f"server tool {tool.type!r} is not supported; define it as a custom tool"
            )
        schema = tool.input_schema or {"type": "object", "properties": {}}
        function = {"name": tool.name, "description": tool.description or "", "parameters": schema}
        out.append({"type": "function", "function": function})
    return out


def parses_tools(choice: ToolChoice | None, tools: list[dict] | None) -> bool:
    """Whether tool calls are parsed from the output (not constrained: the model decides)."""
    if choice is None:
        return bool(tools)
    if choice.type == "none":
        return False
    if not tools:
        raise APIError(400, f"tool_choice {choice.type!r} needs tools")
    if choice.type == "tool" and choice.name not in {t["function"]["name"] for t in tools}:
        raise APIError(400, f"tool_choice names {choice.name!r}, which is not in tools")
    return True


def template_kwargs(thinking: Any) -> dict[str, Any] | None:
    if thinking is None or thinking.type not in ("enabled", "disabled"):
        return None
    return {"enable_thinking": thinking.type == "enabled"}


def blocks_of(pieces: list[Piece]) -> list[OutputBlock]:
    """Pieces as content blocks: runs of text or thinking merged, one block per tool call."""
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
    return blocks or [TextBlock("")]


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
        self, data: MessagesRequest, container: Container, request: Request
    ) -> Message:
        check_model(container, data.model)
        if not data.messages:
            raise APIError(400, "messages must not be empty")
        service = container.generation
        tools = tools_to_template(data.tools)
        parse_tools = parses_tools(data.tool_choice, tools)
        messages = messages_to_template(data.system, data.messages)
        prompt = await service.render_chat(messages, tools, template_kwargs(data.thinking))
        gen = service.build_request(
            prompt.tokens,
            max_tokens=data.max_tokens,
            temperature=data.temperature,
            top_p=data.top_p,
            top_k=data.top_k,
            seed=None,
            stop=data.stop_sequences,
        )
        fmt = OutputFormat.of(service.tokenizer)
        splitter = OutputSplitter(
            fmt,
            tools=tools,
            parse_tools=parse_tools,
            in_reasoning=fmt.opens_in_reasoning(prompt.text),
        )
        mid = f"msg_{uuid.uuid4().hex[:24]}"
        if data.stream:
            service.check_capacity()
            return EventStream(MessageStream(mid, data.model).run(container, gen, splitter))  # type: ignore[return-value]
        result: Completion = await unless_disconnected(request.receive, service.complete(gen))
        pieces = splitter.feed(result.text) + splitter.finish()
        return Message(
            id=mid,
            model=data.model,
            content=blocks_of(pieces),
            stop_reason=stop_reason(
                result.finish_reason, result.stop_sequence, splitter.tool_calls
            ),  # type: ignore[arg-type]
            stop_sequence=result.stop_sequence,
            usage=usage(result.prompt_tokens, result.completion_tokens, result.cached_tokens),
        )

    @post(
        "/count_tokens",
        status_code=200,
        operation_id="countMessageTokens",
        summary="Count a request's input tokens",
        responses=_ERRORS,
    )
    async def count_tokens(self, data: CountTokensRequest, container: Container) -> TokenCount:
        check_model(container, data.model)
        tools = tools_to_template(data.tools)
        parses_tools(data.tool_choice, tools)
        messages = messages_to_template(data.system, data.messages)
        prompt = await container.generation.render_chat(
            messages, tools, template_kwargs(data.thinking)
        )
        return TokenCount(len(prompt.tokens))
