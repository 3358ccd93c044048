"""Responses-API requests as API-neutral ``ChatRequest``s, and the parameters omlx refuses.

The rule (DESIGN §6): a parameter that would change the output and that omlx does not
honour is a 400 naming it; one that changes nothing the model writes is accepted. Tool
types omlx cannot run (``web_search``, ``namespace`` and the other hosted tools, which
Codex always sends) are left out of the prompt and named in a log line instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from omlx.app.api.openai.params import response_format_of
from omlx.app.api.responses.items import ItemRenderer, canonical_items
from omlx.app.api.responses.schemas import ResponsesRequest, ToolParam
from omlx.app.chat.image_parts import ImageSource
from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.pipeline import (
    ChatRequest,
    ResponseFormat,
    Sampling,
    ToolChoice,
    check_tool_choice,
)
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.errors import InvalidRequest
from omlx.domain.json_values import JsonObject

log = logging.getLogger(__name__)

ENCRYPTED_REASONING = "reasoning.encrypted_content"
# include values about hosted tools, which omlx never produces, and input image URLs, which
# its input items keep as sent: asking for them changes nothing.
_INCLUDE_NO_EFFECT = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    }
)
# The Responses API's efforts, as the values chat templates take (gpt-oss: low/medium/high).
_EFFORT = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
_left_out_logged: set[tuple[str, ...]] = set()


@dataclass(slots=True)
class Translated:
    chat: ChatRequest
    items: list[JsonObject]  # the resolved conversation: history, then this request's items
    encrypted_reasoning: bool  # include asks for reasoning.encrypted_content


class Translator:
    """One request's translation: the normalizer, the seal and the renderer's abilities."""

    def __init__(
        self, normalizer: PromptNormalizer, seal: ReasoningSeal, *, effort_kwarg: bool = False
    ) -> None:
        self.normalizer = normalizer
        self.items = ItemRenderer(normalizer, seal)
        self.effort_kwarg = effort_kwarg

    def translate(
        self, data: ResponsesRequest, model_id: str, history: list[JsonObject] | None = None
    ) -> Translated:
        """``history``: the previous response's conversation (its input, then its output)."""
        refuse_unsupported(data)
        encrypted = check_include(data.include)
        history = history or []
        items = [*history, *canonical_items(data.input)]
        if not items:
            raise InvalidRequest("input is required", param="input")
        messages: list[JsonObject] = []
        labels: list[str] = []
        if data.instructions:
            kept = self.normalizer.system_blocks([data.instructions])
            if kept:
                messages.append({"role": "system", "content": "".join(kept)})
                labels.append("system")
        images: list[ImageSource] = []
        more, more_labels = self.items.messages(items, leading_system=True, images=images)
        messages += more
        labels += more_labels
        if not messages:
            raise InvalidRequest("the input renders no message", param="input")
        tools = tools_to_template(data.tools)
        choice = tool_choice_of(data.tool_choice)
        check_tool_choice(choice, tools)
        chat = ChatRequest(
            model=model_id,
            messages=messages,
            labels=labels,
            tools=tools,
            tool_choice=choice,
            sampling=Sampling(
                max_tokens=data.max_output_tokens,
                temperature=data.temperature,
                top_p=data.top_p,
                max_tokens_param="max_output_tokens",
            ),
            template_kwargs=self.template_kwargs(data),
            parallel_tool_calls=data.parallel_tool_calls is not False,
            several_forced_calls=data.parallel_tool_calls is True,
            response_format=text_format(data),
            image_sources=tuple(images),
        )
        return Translated(chat, items, encrypted)

    def template_kwargs(self, data: ResponsesRequest) -> JsonObject:
        effort = data.reasoning.effort if data.reasoning is not None else None
        if effort is None:
            return {}
        if effort not in _EFFORT:
            raise InvalidRequest(
                f"reasoning.effort {effort!r} is not one of {', '.join(_EFFORT)}",
                param="reasoning.effort",
            )
        kwargs: JsonObject = {}
        if effort == "none":
            kwargs["enable_thinking"] = False  # templates that can turn thinking off (Qwen3)
        if self.effort_kwarg:
            kwargs["reasoning_effort"] = _EFFORT[effort]
        return kwargs


def refuse_unsupported(data: ResponsesRequest) -> None:
    """Parameters that would change the output and that omlx does not honour: 400, named."""
    if data.background:
        raise InvalidRequest("background responses are not supported", param="background")
    if data.truncation not in (None, "disabled"):
        raise InvalidRequest(
            f"truncation {data.truncation!r} is not supported: omlx never drops input "
            "(a prompt past the context is a 400); send truncation 'disabled'",
            param="truncation",
        )
    if data.conversation is not None:
        raise InvalidRequest(
            "conversation is not supported; use previous_response_id or send the history",
            param="conversation",
        )
    if data.prompt is not None:
        raise InvalidRequest("prompt (stored prompt templates) is not supported", param="prompt")
    if data.top_logprobs:
        raise InvalidRequest("top_logprobs is not supported", param="top_logprobs")
    if data.context_management:
        raise InvalidRequest(
            "context_management (server-side compaction) is not supported",
            param="context_management",
        )
    if data.moderation is not None:
        raise InvalidRequest("moderation is not supported", param="moderation")
    text = data.text
    if text is not None and text.verbosity not in (None, "medium"):
        raise InvalidRequest(
            f"text.verbosity {text.verbosity!r} is not supported (only the default, 'medium')",
            param="text.verbosity",
        )


def text_format(data: ResponsesRequest) -> ResponseFormat | None:
    """``text.format``: json_schema (inline ``schema``, ``strict``) or json_object; text is free."""
    if data.text is None or data.text.format is None:
        return None
    return response_format_of(msgspec.to_builtins(data.text.format), param="text.format")


def check_include(include: list[str] | None) -> bool:
    """Whether ``include`` asks for encrypted reasoning; a 400 for what omlx cannot add."""
    for value in include or ():
        if value != ENCRYPTED_REASONING and value not in _INCLUDE_NO_EFFECT:
            raise InvalidRequest(f"include {value!r} is not supported", param="include")
    return ENCRYPTED_REASONING in (include or ())


def tools_to_template(tools: list[JsonObject] | None) -> list[JsonObject] | None:
    """Function tools as template tools; the rest (hosted, namespaces) named in a log line."""
    if not tools:
        return None
    out, left_out = [], []
    for i, raw in enumerate(tools):
        try:
            tool = msgspec.convert(raw, ToolParam)
        except msgspec.ValidationError as exc:
            raise InvalidRequest(f"tools[{i}]: {exc}", param=f"tools[{i}]") from exc
        if tool.type != "function":
            left_out.append(f"{tool.name} ({tool.type})" if tool.name else tool.type)
            continue
        if not tool.name:
            raise InvalidRequest(f"tools[{i}]: a function tool needs a name", param=f"tools[{i}]")
        function: JsonObject = {"name": tool.name, "description": tool.description or ""}
        function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    if left_out:
        key = tuple(left_out)
        # Agents send the same tools every turn: say it once per set, then at debug level.
        level = logging.DEBUG if key in _left_out_logged else logging.INFO
        if len(_left_out_logged) > 256:
            _left_out_logged.clear()
        _left_out_logged.add(key)
        log.log(level, "left out of the prompt, as omlx cannot run them: tools %s", ", ".join(key))
    return out or None


def tool_choice_of(choice: str | JsonObject | None) -> ToolChoice:
    if choice is None or choice == "auto":
        return ToolChoice("auto")
    if choice in ("none", "required"):
        return ToolChoice(choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if isinstance(name, str):
            return ToolChoice("function", name)
    raise InvalidRequest(
        "tool_choice must be none, auto, required or {type: function, name}; "
        f"{choice!r} is not supported",
        param="tool_choice",
    )
