"""OpenAI Responses API bodies as msgspec Structs (the HTTP edge only).

Requests accept unknown fields and every documented one, so that what omlx cannot honour
is refused by name (``responses.translate``) rather than dropped. Output items are plain
dicts in the SDK's shapes (``responses.output``): they are stored and replayed as JSON.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from omlx.domain.json_values import JsonObject


class Part(Struct, kw_only=True):
    """A content part: input_text / output_text / refusal, reasoning_text, summary_text..."""

    type: str
    text: str | None = None
    refusal: str | None = None
    # input_image: a data URL or an http(s) URL; file_id (the Files API) is refused.
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputItem(Struct, kw_only=True):
    """One input item; ``type`` picks which fields matter (a message when it is absent)."""

    type: str | None = None
    id: str | None = None
    status: str | None = None
    # message
    role: str | None = None
    content: str | list[Part] | None = None
    # function_call
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    namespace: str | None = None
    # function_call_output
    output: str | list[Part] | None = None
    # reasoning
    summary: list[Part] | None = None
    encrypted_content: str | None = None


class ToolParam(Struct, kw_only=True):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class ReasoningParam(Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class TextFormat(Struct, kw_only=True, omit_defaults=True):
    type: str = "text"
    # json_schema: the schema inline, as the Responses API has it
    name: str | None = None
    description: str | None = None
    schema: JsonObject | None = None
    strict: bool | None = None


class TextParam(Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(Struct, kw_only=True):
    model: str
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    include: list[str] | None = None
    tools: list[JsonObject] | None = None  # echoed as sent; read as ToolParam
    tool_choice: str | JsonObject | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: ReasoningParam | None = None
    text: TextParam | None = None
    truncation: str | None = None
    metadata: dict[str, str] | None = None
    # Accepted: they change nothing the model writes.
    prompt_cache_key: str | None = None  # a routing hint for later
    prompt_cache_retention: str | None = None
    prompt_cache_options: JsonObject | None = None
    client_metadata: JsonObject | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    stream_options: JsonObject | None = None
    max_tool_calls: int | None = None  # counts built-in tool calls, which omlx never makes
    # Refused with a 400 where set: omlx does not honour them.
    background: bool | None = None
    conversation: str | JsonObject | None = None
    prompt: JsonObject | None = None
    top_logprobs: int | None = None
    context_management: list[JsonObject] | None = None
    moderation: JsonObject | None = None
    omlx_cache_control: str | None = None  # "no-store": restore, keep nothing (cache_edge)


class InputTokensDetails(Struct):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(Struct):
    reasoning_tokens: int


class ResponseUsage(Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(Struct):
    code: str
    message: str


class IncompleteDetails(Struct):
    reason: str


class ResponseObject(Struct, kw_only=True):
    """The Response object; every field written, ``null`` included, as OpenAI's are."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[JsonObject]
    parallel_tool_calls: bool
    previous_response_id: str | None = None
    reasoning: JsonObject | None = None
    store: bool
    temperature: float | None = None
    text: JsonObject
    tool_choice: str | JsonObject
    tools: list[JsonObject]
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] | None = None
    background: bool = False
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    user: str | None = None


class DeletedResponse(Struct):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class InputItemList(Struct):
    data: list[JsonObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: Literal["list"] = "list"
