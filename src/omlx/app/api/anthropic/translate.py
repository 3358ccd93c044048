"""Anthropic Messages requests as API-neutral ``ChatRequest``s.

Takes everything current Claude Code sends: ``system`` messages inside ``messages``,
thinking of every type (its blocks sent back are rendered as the model wrote them, from
the sealed text in their ``signature`` when the client shows none), deferred tools,
``context_management`` thinking edits, ``output_config``. Server tools omlx cannot run
are left out of the prompt and named in a log line.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from omlx.app.api.anthropic.schemas import (
    ImageSourceParam,
    InputBlock,
    InputMessage,
    MessagesRequest,
    OutputConfig,
    ResultPart,
    SystemBlock,
    ToolParam,
)
from omlx.app.api.anthropic.schemas import (
    ToolChoice as AnthropicToolChoice,
)
from omlx.app.chat.image_parts import ImageSource, refuse_image, sources_in, template_content
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

_REASONING_EFFORT = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


class Translator:
    """One request's translation: the normalizer, the seal and the renderer's abilities."""

    def __init__(
        self, normalizer: PromptNormalizer, seal: ReasoningSeal, *, effort_kwarg: bool = False
    ) -> None:
        self.normalizer = normalizer
        self.seal = seal
        self.effort_kwarg = effort_kwarg

    def chat_request(self, data: MessagesRequest, model_id: str) -> ChatRequest:
        if not data.messages:
            raise InvalidRequest("messages must not be empty", param="messages")
        _refuse_unsupported(data)
        tools, deferred = tools_to_template(data.tools)
        images: list[ImageSource] = []
        messages, labels = self.messages_to_template(data, deferred, images)
        choice = tool_choice_of(data.tool_choice)
        check_tool_choice(choice, tools)
        kwargs: JsonObject = {}
        thinking = data.thinking.type if data.thinking is not None else None
        if thinking in ("enabled", "disabled"):
            kwargs["enable_thinking"] = thinking == "enabled"
        effort = data.output_config.effort if data.output_config is not None else None
        if effort is not None:
            if effort not in _REASONING_EFFORT:
                raise InvalidRequest(
                    f"output_config.effort {effort!r} is not one of {', '.join(_REASONING_EFFORT)}",
                    param="output_config.effort",
                )
            if self.effort_kwarg:
                kwargs["reasoning_effort"] = _REASONING_EFFORT[effort]
        parallel = not (data.tool_choice is not None and data.tool_choice.disable_parallel_tool_use)
        return ChatRequest(
            model=model_id,
            messages=messages,
            labels=labels,
            tools=tools,
            tool_choice=choice,
            sampling=Sampling(
                max_tokens=data.max_tokens,
                temperature=data.temperature,
                top_p=data.top_p,
                top_k=data.top_k,
                stop=data.stop_sequences,
            ),
            template_kwargs=kwargs,
            parallel_tool_calls=parallel,
            response_format=output_format(data.output_config),
            reasoning_budget=thinking_budget(data),
            image_sources=tuple(images),
        )

    def messages_to_template(
        self,
        data: Any,
        deferred: dict[str, JsonObject] | None = None,
        images: list[ImageSource] | None = None,
    ) -> tuple[list[JsonObject], list[str]]:
        """Template messages and the request part each came from ("system", "messages[k]");
        the images they hold are added to ``images`` in order."""
        out: list[JsonObject] = []
        labels: list[str] = []
        if text := self.system_text(data.system):
            out.append({"role": "system", "content": text})
            labels.append("system")
        keep_thinking = thinking_turns_kept(data)
        assistants = [i for i, m in enumerate(data.messages) if m.role == "assistant"]
        cleared = (
            set(assistants[: max(len(assistants) - keep_thinking, 0)])
            if keep_thinking is not None
            else set()
        )
        found: list[ImageSource] = [] if images is None else images
        for k, message in enumerate(data.messages):
            where = f"messages[{k}]"
            for item in self._message(message, k in cleared, deferred or {}, where, found):
                out.append(item)
                labels.append(f"messages[{k}]")
        return out, labels

    def system_text(self, system: str | list[SystemBlock] | None) -> str:
        if isinstance(system, list):
            blocks = [b.text for b in system if b.type == "text"]
        else:
            blocks = [system] if system else []
        return "\n\n".join(self.normalizer.system_blocks(blocks))

    def _message(
        self,
        message: InputMessage,
        clear_thinking: bool,
        deferred: dict[str, dict],
        where: str,
        images: list[ImageSource],
    ) -> list[JsonObject]:
        if message.role != "user" and isinstance(message.content, list):
            for j, block in enumerate(message.content):
                if block.type == "image":
                    raise refuse_image(f"{where}.content[{j}]", message.role)
        if message.role == "system":
            content = message.content
            blocks = (
                [content]
                if isinstance(content, str)
                else [b.text or "" for b in content if b.type == "text"]
            )
            text = "\n\n".join(self.normalizer.system_blocks(blocks))
            return [{"role": "system", "content": text}] if text else []
        if isinstance(message.content, str):
            return [{"role": message.role, "content": message.content}]
        if message.role == "assistant":
            return [self._assistant(message.content, clear_thinking)]
        return _user_to_template(message.content, deferred, where, images)

    def _assistant(self, blocks: list[InputBlock], clear_thinking: bool) -> JsonObject:
        texts, thinking, calls = [], [], []
        for block in blocks:
            if block.type == "text":
                texts.append(block.text or "")
            elif block.type in ("thinking", "redacted_thinking"):
                if not clear_thinking:
                    thinking.append(self.thinking_text(block))
            elif block.type in ("tool_use", "server_tool_use"):
                if not block.id or not block.name:
                    raise InvalidRequest(
                        "a tool_use block needs an id and a name", param="messages"
                    )
                calls.append(
                    {
                        "id": block.id,
                        "type": "function",
                        "function": {"name": block.name, "arguments": block.input or {}},
                    }
                )
            else:
                raise InvalidRequest(
                    f"assistant content blocks of type {block.type!r} are not supported",
                    param="messages",
                )
        out: JsonObject = {"role": "assistant", "content": "".join(texts)}
        if calls:
            out["tool_calls"] = calls
        if reasoning := "".join(thinking):
            out["reasoning_content"] = reasoning
        return out

    def thinking_text(self, block: InputBlock) -> str:
        """The thinking as the model produced it: sealed in the signature, else as sent."""
        sealed = (
            self.seal.open(block.signature)
            if block.type == "thinking"
            else self.seal.open(block.data)
        )
        if sealed is not None:
            return sealed
        return block.thinking or ""


def _user_to_template(
    blocks: list[InputBlock], deferred: dict[str, dict], where: str, images: list[ImageSource]
) -> list[JsonObject]:
    """A user turn's blocks: its text and images as user messages, each tool_result a tool
    message (Claude Code's Read tool sends a picture as a tool_result image)."""
    out: list[JsonObject] = []
    pending: list[str | ImageSource] = []
    for j, block in enumerate(blocks):
        if block.type == "text":
            pending.append(block.text or "")
        elif block.type == "image":
            pending.append(image_source(block.source, f"{where}.content[{j}]"))
        elif block.type == "tool_result":
            if pending:
                out.append({"role": "user", "content": template_content(pending, "\n")})
                images.extend(sources_in(pending))
                pending = []
            pieces = _result_pieces(block.content, deferred, f"{where}.content[{j}]")
            if block.is_error:
                pieces = _error_prefixed(pieces)
            images.extend(sources_in(pieces))
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id or "",
                    "content": template_content(pieces, "\n"),
                }
            )
        elif block.type in ("thinking", "redacted_thinking"):
            continue  # thinking belongs to assistant turns; a client echoing it here adds nothing
        else:
            raise InvalidRequest(
                f"user content blocks of type {block.type!r} are not supported; send text or images",
                param="messages",
            )
    if pending or not out:
        out.append({"role": "user", "content": template_content(pending, "\n")})
        images.extend(sources_in(pending))
    return out


def _error_prefixed(pieces: list[str | ImageSource]) -> list[str | ImageSource]:
    """A failed tool's result: "Error: " joins its first text, or goes before a first image."""
    first = pieces[0]
    if isinstance(first, str):
        return [f"Error: {first}", *pieces[1:]]
    return ["Error: ", *pieces]


def image_source(source: ImageSourceParam | None, where: str) -> ImageSource:
    """An image block's source as the image it names: base64 as a data URL, or its URL."""
    if source is not None and source.type == "base64" and source.data:
        media = source.media_type or "application/octet-stream"
        return ImageSource(where, f"data:{media};base64,{source.data}")
    if source is not None and source.type == "url" and source.url:
        return ImageSource(where, source.url)
    kind = source.type if source is not None else None
    raise InvalidRequest(
        f"{where}: an image block needs a source of type base64 (media_type, data) or url; "
        f"{kind!r} is not taken",
        param=where,
    )


def _result_pieces(
    content: str | list[ResultPart] | None, deferred: dict[str, dict], where: str
) -> list[str | ImageSource]:
    """A tool_result's content in order: text (joined as before) and its images."""
    if not isinstance(content, list):
        return [content or ""]
    parts: list[str | ImageSource] = []
    for m, part in enumerate(content):
        if part.type == "text":
            parts.append(part.text or "")
        elif part.type == "image":
            parts.append(image_source(part.source, f"{where}.content[{m}]"))
        elif part.type == "tool_reference":
            # A deferred tool loaded by tool search: its definition joins the prompt here,
            # where the reference is, so the prefix before it stays as it was.
            tool = deferred.get(part.tool_name or "")
            if tool is None:
                raise InvalidRequest(
                    f"tool_reference names {part.tool_name!r}, which is not a deferred tool",
                    param="messages",
                )
            parts.append(json.dumps(tool, ensure_ascii=False))
        else:
            raise InvalidRequest(
                f"tool_result content of type {part.type!r} is not supported; send text or images",
                param="messages",
            )
    return parts or [""]


def tools_to_template(tools: list[ToolParam] | None) -> tuple[list[dict] | None, dict[str, dict]]:
    """Custom tools as template tools, and the deferred ones (``defer_loading``) by name.

    Deferred tools stay out of the prompt until a tool_reference loads them; server tools
    (web search, code execution...) omlx cannot run and leaves out, saying so.
    """
    if not tools:
        return None, {}
    out, deferred, skipped = [], {}, []
    for tool in tools:
        if tool.type not in (None, "custom"):
            skipped.append(f"{tool.name or '?'} ({tool.type})")
            continue
        schema = tool.input_schema or {"type": "object", "properties": {}}
        function = {"name": tool.name, "description": tool.description or "", "parameters": schema}
        if tool.defer_loading:
            deferred[tool.name] = {"type": "function", "function": function}
        else:
            out.append({"type": "function", "function": function})
    if skipped:
        log.info(
            "left out of the prompt, as omlx cannot run them: server tools %s", ", ".join(skipped)
        )
    return out or None, deferred


def tool_choice_of(choice: AnthropicToolChoice | None) -> ToolChoice:
    if choice is None or choice.type == "auto":
        return ToolChoice("auto")
    if choice.type == "any":
        return ToolChoice("required")
    if choice.type == "tool":
        return ToolChoice("function", choice.name)
    return ToolChoice("none")


def thinking_budget(data: MessagesRequest) -> int | None:
    """``thinking.budget_tokens`` (with ``type: enabled``): reasoning is cut there.

    A budget at or past ``max_tokens`` is taken as it is (Anthropic refuses it): clients send
    their usual budget with smaller limits, and ``max_tokens`` then cuts first.
    """
    thinking = data.thinking
    if thinking is None or thinking.type != "enabled" or thinking.budget_tokens is None:
        return None
    if thinking.budget_tokens < 1:
        raise InvalidRequest(
            "thinking.budget_tokens must be at least 1", param="thinking.budget_tokens"
        )
    return thinking.budget_tokens


def output_format(config: OutputConfig | None) -> ResponseFormat | None:
    """``output_config.format`` (structured outputs): ``{type: json_schema, schema}``, enforced."""
    raw = config.format if config is not None else None
    if raw is None:
        return None
    param = "output_config.format"
    if raw.get("type") != "json_schema":
        raise InvalidRequest(f"{param} type {raw.get('type')!r} is not 'json_schema'", param=param)
    schema = raw.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}.schema must be a JSON schema object", param=param)
    # Anthropic's structured outputs promise the schema: what cannot be enforced is a 400.
    return ResponseFormat(schema, strict=True, param=param)


def thinking_turns_kept(data: Any) -> int | None:
    """How many recent assistant turns keep their thinking (context_management); None: all."""
    edits = data.context_management.edits if getattr(data, "context_management", None) else None
    for edit in edits or []:
        kind = edit.get("type")
        if kind != "clear_thinking_20251015":
            raise InvalidRequest(
                f"context_management edit {kind!r} is not supported (omlx applies clear_thinking_20251015)",
                param="context_management",
            )
        keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
        if keep == "all":
            return None
        if (
            isinstance(keep, dict)
            and keep.get("type") == "thinking_turns"
            and isinstance(keep.get("value"), int)
        ):
            return max(keep["value"], 0)
        raise InvalidRequest(
            f"clear_thinking keep {keep!r} is not 'all' or {{type: thinking_turns, value: N}}",
            param="context_management",
        )
    return None


def _refuse_unsupported(data: MessagesRequest) -> None:
    """Parameters that would change the output and that omlx does not honour: 400, named."""
    if data.mcp_servers:
        raise InvalidRequest(
            "mcp_servers are not supported: omlx runs no MCP client", param="mcp_servers"
        )
    if data.container is not None:
        raise InvalidRequest("container (code execution) is not supported", param="container")
