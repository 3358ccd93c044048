"""OpenAI-compatible routes: chat completions, completions, models."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import msgspec
from litestar import Controller, Request, get, post

from omlx.app.api.checks import check_model
from omlx.app.api.errors import APIError
from omlx.app.api.openai_schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    OpenAIErrorResponse,
    ResponseMessage,
    TextCompletion,
    ToolCall,
    ToolCallFunction,
)
from omlx.app.api.openai_stream import (
    ChatStream,
    call_id,
    chat_finish_reason,
    text_stream,
    usage_of,
)
from omlx.app.api.openapi import error_responses, streaming_operation
from omlx.app.api.output import OutputFormat, OutputSplitter, collect
from omlx.app.api.sse import EventStream
from omlx.app.container import Container
from omlx.app.generation import unless_disconnected

_ERRORS = error_responses(OpenAIErrorResponse, 400, 401, 404, 413, 429, 500)


def _text_of(content: str | list | None, param: str) -> str:
    if not isinstance(content, list):
        return content or ""
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise APIError(
                400, f"content part type {part.type!r} is not supported; send text", param=param
            )
        texts.append(part.text)
    return "".join(texts)


def template_arguments(arguments: str) -> Any:
    """Tool-call arguments as chat templates expect them: a dict where the JSON is an object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def message_to_template(message: ChatMessage) -> dict[str, Any]:
    """A chat message in the dict form chat templates expect; text parts joined."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": _text_of(message.content, "messages")}
    if message.name:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": template_arguments(c.function.arguments),
                },
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning_content:
        out["reasoning_content"] = message.reasoning_content
    return out


def check_n(n: int | None) -> None:
    if n is not None and n != 1:
        raise APIError(400, "n must be 1: omlx generates one choice per request", param="n")


def check_tool_choice(choice: str | dict[str, Any] | None, tools: list[dict] | None) -> bool:
    """Validate ``tool_choice``; True when tool calls are to be parsed from the output.

    Output is not constrained: ``required`` or a named function is passed to the
    template like ``auto``, and the model decides.
    """
    names = {t["function"]["name"] for t in tools or ()}
    if choice is None or choice == "auto":
        return bool(tools)
    if choice == "none":
        return False
    if choice == "required":
        if not tools:
            raise APIError(400, "tool_choice 'required' needs tools", param="tool_choice")
        return True
    if isinstance(choice, dict):
        name = (
            (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        )
        if not isinstance(name, str):
            raise APIError(
                400,
                "tool_choice must be none, auto, required or {type: function, function: {name}}",
                param="tool_choice",
            )
        if name not in names:
            raise APIError(
                400, f"tool_choice names {name!r}, which is not in tools", param="tool_choice"
            )
        return True
    raise APIError(
        400, f"tool_choice {choice!r} is not one of none, auto, required", param="tool_choice"
    )


class OpenAIController(Controller):
    path = "/v1"
    tags = ("openai",)

    @get(
        "/models",
        operation_id="listModels",
        summary="List the served models",
        responses=error_responses(OpenAIErrorResponse, 401),
    )
    async def list_models(self, container: Container) -> ModelList:
        return ModelList([ModelCard(m, container.started_at) for m in sorted(container.model_ids)])

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
        self, data: ChatCompletionRequest, container: Container, request: Request
    ) -> ChatCompletion:
        check_model(container, data.model)
        check_n(data.n)
        if not data.messages:
            raise APIError(400, "messages must not be empty", param="messages")
        service = container.generation
        messages = [message_to_template(m) for m in data.messages]
        tools = [msgspec.to_builtins(t) for t in data.tools] if data.tools else None
        parse_tools = check_tool_choice(data.tool_choice, tools)
        prompt = await service.render_chat(messages, tools, data.chat_template_kwargs)
        max_tokens = (
            data.max_completion_tokens
            if data.max_completion_tokens is not None
            else data.max_tokens
        )
        gen = service.build_request(
            prompt.tokens,
            max_tokens=max_tokens,
            temperature=data.temperature,
            top_p=data.top_p,
            top_k=data.top_k,
            seed=data.seed,
            stop=data.stop,
            max_tokens_param="max_completion_tokens"
            if data.max_completion_tokens is not None
            else "max_tokens",
        )
        fmt = OutputFormat.of(service.tokenizer)
        splitter = OutputSplitter(
            fmt,
            tools=tools,
            parse_tools=parse_tools,
            in_reasoning=fmt.opens_in_reasoning(prompt.text),
        )
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if data.stream:
            service.check_capacity()
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            stream = ChatStream(rid, created, data.model, include_usage)
            return EventStream(stream.run(container, gen, splitter))  # type: ignore[return-value]
        result = await unless_disconnected(request.receive, service.complete(gen))
        text, reasoning, calls = collect(splitter.feed(result.text) + splitter.finish())
        message = ResponseMessage(
            role="assistant",
            content=text if text or not calls else None,
            refusal=None,
            tool_calls=[
                ToolCall(
                    id=call_id(), function=ToolCallFunction(name=c.name, arguments=c.arguments)
                )
                for c in calls
            ]
            or None,
            reasoning_content=reasoning or None,
        )
        return ChatCompletion(
            id=rid,
            created=created,
            model=data.model,
            choices=[Choice(0, message, chat_finish_reason(result.finish_reason, len(calls)))],
            usage=usage_of(result.prompt_tokens, result.completion_tokens, result.cached_tokens),
        )

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
        self, data: CompletionRequest, container: Container, request: Request
    ) -> TextCompletion:
        check_model(container, data.model)
        check_n(data.n)
        service = container.generation
        prompt = _one_prompt(data.prompt)
        tokens = service.encode_text(prompt) if isinstance(prompt, str) else prompt
        gen = service.build_request(
            tokens,
            max_tokens=data.max_tokens if data.max_tokens is not None else 16,
            temperature=data.temperature,
            top_p=data.top_p,
            top_k=data.top_k,
            seed=data.seed,
            stop=data.stop,
        )
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        prefix = prompt if (data.echo and isinstance(prompt, str)) else ""
        if data.stream:
            service.check_capacity()
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            return EventStream(
                text_stream(container, gen, rid, created, data.model, prefix, include_usage)
            )  # type: ignore[return-value]
        result = await unless_disconnected(request.receive, service.complete(gen))
        return TextCompletion(
            id=rid,
            created=created,
            model=data.model,
            choices=[
                CompletionChoice(
                    0,
                    prefix + result.text,
                    "length" if result.finish_reason == "length" else "stop",
                )
            ],
            usage=usage_of(result.prompt_tokens, result.completion_tokens, result.cached_tokens),
        )


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
        raise APIError(400, "one prompt per request", param="prompt")
    raise APIError(
        400,
        "prompt must be a string, a list of token ids, or a one-item list of either",
        param="prompt",
    )
