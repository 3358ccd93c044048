"""Anthropic Messages API bodies as msgspec Structs (the HTTP edge only).

Requests accept unknown fields and every block type's fields in one Struct
(``cache_control`` included: breakpoints pin their prefix, ``cache_hints``).
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType

from omlx.domain.json_values import JsonObject


class ImageSourceParam(Struct, kw_only=True):
    """An image block's source: ``base64`` (``media_type``, ``data``) or ``url``."""

    type: str
    media_type: str | None = None  # not trusted: the bytes say what they are
    data: str | None = None
    url: str | None = None


class ResultPart(Struct, kw_only=True):
    """A block inside a ``tool_result``'s content (text, image, tool_reference)."""

    type: str
    text: str | None = None
    tool_name: str | None = None  # tool_reference: a deferred tool loaded by tool search
    source: ImageSourceParam | None = None  # image


class InputBlock(Struct, kw_only=True):
    """Any input content block: text, tool_use, tool_result, thinking, image..."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: JsonObject | None = None
    tool_use_id: str | None = None
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    source: ImageSourceParam | None = None  # image
    cache_control: JsonObject | None = None


class InputMessage(Struct, kw_only=True):
    # "system" inside messages: Claude Code sends its environment block that way.
    role: Literal["user", "assistant", "system"]
    content: str | list[InputBlock]


class SystemBlock(Struct, kw_only=True):
    type: str = "text"
    text: str = ""
    cache_control: JsonObject | None = None


class ToolParam(Struct, kw_only=True):
    name: str = ""
    description: str | None = None
    input_schema: JsonObject | None = None
    type: str | None = None  # "custom" or absent; server tools are left out of the prompt
    defer_loading: bool | None = None  # loaded by tool search (a tool_reference) only
    strict: bool | None = None
    cache_control: JsonObject | None = None


class ToolChoice(Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive"]  # adaptive: the template's default
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None  # omitted: thinking sent sealed only


class OutputConfig(Struct, kw_only=True):
    effort: str | None = None
    format: JsonObject | None = None


class ContextManagement(Struct, kw_only=True):
    edits: list[JsonObject] | None = None


class DiagnosticsParam(Struct, kw_only=True):
    previous_message_id: str | None = None


class MessagesRequest(Struct, kw_only=True):
    model: str
    messages: list[InputMessage]
    max_tokens: int
    system: str | list[SystemBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingParam | None = None
    metadata: JsonObject | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    diagnostics: DiagnosticsParam | None = None
    mcp_servers: list[JsonObject] | None = None
    container: Any = None
    service_tier: str | None = None
    cache_control: JsonObject | None = None  # automatic caching: a breakpoint at the end
    omlx_cache_control: str | None = None  # "no-store": restore, keep nothing (cache_edge)


class CountTokensRequest(Struct, kw_only=True):
    model: str
    messages: list[InputMessage]
    system: str | list[SystemBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingParam | None = None
    context_management: ContextManagement | None = None


class TokenCount(Struct):
    input_tokens: int


class TextBlock(Struct, tag="text", tag_field="type"):
    text: str


class ThinkingBlock(Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str = ""


class ToolUseBlock(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: JsonObject


OutputBlock = TextBlock | ThinkingBlock | ToolUseBlock


class MessageUsage(Struct):
    # input_tokens excludes cache reads, as Anthropic counts them: prompt = input + cache_read
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(Struct, kw_only=True):
    id: str
    model: str
    content: list[OutputBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: MessageUsage
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    # Only with the cache-diagnosis beta: {"cache_miss_reason": {...} | None}
    diagnostics: JsonObject | UnsetType = UNSET


class AnthropicErrorDetail(Struct):
    type: str
    message: str


class AnthropicErrorResponse(Struct):
    """Anthropic's error envelope (STYLE §7)."""

    error: AnthropicErrorDetail
    type: Literal["error"] = "error"
