"""OpenAI chat requests as API-neutral ``ChatRequest``s (messages, tools, tool choice)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from omlx.app.api.openai.params import (
    chat_sampling,
    effort_kwargs,
    refuse_unsupported_chat,
    response_format_of,
)
from omlx.app.api.openai.schemas import ChatCompletionRequest, ChatMessage, ContentPart
from omlx.app.chat.image_parts import (
    ImageSource,
    check_detail,
    refuse_image,
    sources_in,
    template_content,
)
from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.pipeline import ChatRequest, ToolChoice, check_tool_choice
from omlx.app.errors import InvalidRequest
from omlx.domain.json_values import JsonObject


def text_of(content: str | list | None, param: str) -> str:
    if not isinstance(content, list):
        return content or ""
    texts = []
    for part in content:
        if part.type not in ("text", "input_text", "output_text") or part.text is None:
            raise InvalidRequest(
                f"content part type {part.type!r} is not supported; send text or image_url",
                param=param,
            )
        texts.append(part.text)
    return "".join(texts)


def image_of(part: ContentPart, where: str) -> ImageSource:
    """An ``image_url`` part (``{url, detail}``, or the URL alone) as the image it names."""
    image = part.image_url
    if image is None:
        raise InvalidRequest(f"{where}: an image_url part needs image_url.url", param=where)
    if isinstance(image, str):
        return ImageSource(where, image)
    check_detail(image.detail, f"{where}.image_url.detail")
    return ImageSource(where, image.url)


def pieces_of(
    content: str | list[ContentPart] | None, role: str, where: str
) -> list[str | ImageSource]:
    """A message's text and images in order; ``where``: the message ("messages[2]")."""
    if not isinstance(content, list):
        return [content or ""]
    pieces: list[str | ImageSource] = []
    for j, part in enumerate(content):
        if part.type == "image_url":
            if role != "user":
                raise refuse_image(f"{where}.content[{j}]", role)
            pieces.append(image_of(part, f"{where}.content[{j}]"))
        else:
            pieces.append(text_of([part], "messages"))
    return pieces


def template_arguments(arguments: str) -> Any:
    """Tool-call arguments as chat templates expect them: a dict where the JSON is an object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def message_to_template(
    message: ChatMessage,
    normalizer: PromptNormalizer,
    where: str = "messages",
    images: list[ImageSource] | None = None,
) -> JsonObject | None:
    """A chat message in the dict form chat templates expect; text parts joined.

    System text goes through the prompt normalizations (block by block); a system message
    they empty is left out (None). Its images (user messages only) are added to ``images``.
    """
    role = "system" if message.role == "developer" else message.role
    if role == "system":
        if isinstance(message.content, list):
            for j, p in enumerate(message.content):
                if p.type == "image_url":
                    raise refuse_image(f"{where}.content[{j}]", message.role)
            blocks = [text_of([p], "messages") for p in message.content]
        else:
            blocks = [message.content or ""]
        kept = normalizer.system_blocks(blocks)
        if blocks and not kept:
            return None
        content: str | list[JsonObject] = "".join(kept)
    else:
        pieces = pieces_of(message.content, role, where)
        content = template_content(pieces, "")
        if images is not None:
            images.extend(sources_in(pieces))
    out: JsonObject = {"role": role, "content": content}
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


def tool_choice_of(choice: str | JsonObject | None) -> ToolChoice:
    if choice is None or choice == "auto":
        return ToolChoice("auto")
    if choice in ("none", "required"):
        return ToolChoice(choice)
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            return ToolChoice("function", name)
        raise InvalidRequest(
            "tool_choice must be none, auto, required or {type: function, function: {name}}",
            param="tool_choice",
        )
    raise InvalidRequest(
        f"tool_choice {choice!r} is not one of none, auto, required", param="tool_choice"
    )


def chat_request(
    data: ChatCompletionRequest,
    model_id: str,
    normalizer: PromptNormalizer,
    *,
    effort_kwarg: bool = False,
) -> ChatRequest:
    if not data.messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    refuse_unsupported_chat(data)
    messages, labels = [], []
    images: list[ImageSource] = []
    for i, message in enumerate(data.messages):
        out = message_to_template(message, normalizer, f"messages[{i}]", images)
        if out is None:
            continue
        leading = all(m["role"] == "system" for m in messages) and out["role"] == "system"
        messages.append(out)
        labels.append("system" if leading else f"messages[{i}]")
    tools = [msgspec.to_builtins(t) for t in data.tools] if data.tools else None
    choice = tool_choice_of(data.tool_choice)
    check_tool_choice(choice, tools)
    kwargs = effort_kwargs(data.reasoning_effort, "reasoning_effort", effort_kwarg)
    return ChatRequest(
        model=model_id,
        messages=messages,
        labels=labels,
        tools=tools,
        tool_choice=choice,
        sampling=chat_sampling(data),
        template_kwargs={**kwargs, **(data.chat_template_kwargs or {})},
        parallel_tool_calls=data.parallel_tool_calls is not False,
        several_forced_calls=data.parallel_tool_calls is True,
        response_format=response_format_of(data.response_format),
        image_sources=tuple(images),
    )
