"""OpenAI request and response bodies as msgspec Structs (the HTTP edge only).

Requests accept unknown fields (clients send extras); responses carry exactly
what OpenAI's published schemas require, ``null`` where they say nullable.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from omlx.domain.json_values import JsonObject


class ImageURL(Struct, kw_only=True):
    url: str
    detail: str | None = None  # auto only: the model's processor sizes images its own way


class ContentPart(Struct, kw_only=True):
    type: str
    text: str | None = None
    image_url: ImageURL | str | None = None  # type image_url


class ToolCallFunction(Struct, kw_only=True):
    name: str
    arguments: str = "{}"


class ToolCall(Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None


class Tool(Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class ChatCompletionRequest(Struct, kw_only=True):
    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: str | JsonObject | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    # vLLM's and mlx-lm's extension, e.g. {"enable_thinking": false}
    chat_template_kwargs: JsonObject | None = None
    response_format: JsonObject | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM's and mlx-lm's extension
    min_p: float | None = None  # vLLM's and mlx-lm's extension
    logit_bias: dict[str, float] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    # Accepted: they change nothing the model writes (openai.params lists them all).
    metadata: JsonObject | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: JsonObject | None = None
    safety_identifier: str | None = None
    prediction: JsonObject | None = None  # a latency hint: the output stays the model's
    # Refused with a 400 where set: omlx does not honour them.
    audio: Any = None
    modalities: list[str] | None = None
    functions: Any = None
    function_call: Any = None
    web_search_options: Any = None
    moderation: Any = None
    omlx_cache_control: str | None = None  # "no-store": restore, keep nothing (cache_edge)


class CompletionRequest(Struct, kw_only=True):
    model: str
    # A string, token ids, or a one-item batch of either (msgspec allows one array type).
    prompt: str | list[str | int | list[int]]
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    user: str | None = None
    logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None
    # Refused with a 400 where set: omlx does not honour them.
    best_of: int | None = None
    suffix: str | None = None
    omlx_cache_control: str | None = None  # "no-store": restore, keep nothing (cache_edge)


class PromptTokensDetails(Struct):
    cached_tokens: int = 0


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ResponseMessage(Struct, kw_only=True, omit_defaults=True):
    # content and refusal have no default so they are always written, null included,
    # as OpenAI's schema requires; the optional fields are omitted when unset.
    role: Literal["assistant"]
    content: str | None
    refusal: None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobBody(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct):
    content: list[TokenLogprobBody] | None
    refusal: None = None


class Choice(Struct):
    index: int
    message: ResponseMessage
    finish_reason: str
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"


class ToolCallFunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunctionDelta | None = None


class Delta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | None = None


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class TextCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType = UNSET  # the schema has no null usage: omitted until known
    object: Literal["text_completion"] = "text_completion"


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str = "omlx"
    object: Literal["model"] = "model"
    # omlx's extras: the names that answer with this model, or the model an alias answers with
    aliases: list[str] | UnsetType = UNSET
    alias_of: str | UnsetType = UNSET
    state: str | UnsetType = UNSET  # loaded | loading | available (loaded on its first request)
    task: str | UnsetType = UNSET  # chat | embedding | rerank
    # A loaded chat model's context (prompt + output tokens): what agents size their windows by
    context_length: int | UnsetType = UNSET


class ModelList(Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


class OpenAIErrorDetail(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorResponse(Struct):
    """OpenAI's error envelope (STYLE §7)."""

    error: OpenAIErrorDetail


def encode(value: Struct) -> str:
    return msgspec.json.encode(value).decode()
