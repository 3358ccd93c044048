"""Tools shown to a model whose chat template renders none (omlx's documented fallback).

Such a template drops ``tools`` without a word, so the model never learns of them. The
fallback puts them in the system turn, with the one call syntax omlx then reads and, for
a forced call, constrains: Hermes ``<tool_call>{"name": …, "arguments": …}</tool_call>``.
Earlier calls and their results are written the same way, so the model sees its own
calls as it wrote them and each turn's prompt extends the previous one.
"""

from __future__ import annotations

import contextlib
import json

from omlx.domain.json_values import JsonObject

PROBE_TOOL = "omlx_probe_tool"
_INSTRUCTIONS = (
    "# Tools\n\n"
    "You can call functions to help with the request. Each is described below as JSON, its "
    "parameters as a JSON Schema:\n<tools>\n{tools}\n</tools>\n\n"
    "To call one, answer with its name and its arguments as a JSON object, between tags:\n"
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments>}}}}\n</tool_call>\n'
    "Each result comes back to you between <tool_response> tags."
)


def tools_text(tools: list[JsonObject]) -> str:
    """The system-turn section that describes ``tools`` and how to call them."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return _INSTRUCTIONS.format(tools=lines)


def call_text(call: JsonObject) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def with_tools_in_system(messages: list[JsonObject], tools: list[JsonObject]) -> list[JsonObject]:
    """``messages`` with the tools' section ending the leading system message (one is
    added if there is none)."""
    section = tools_text(tools)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        text = first.get("content") or ""
        first["content"] = f"{text}\n\n{section}" if text else section
        return [first, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]


def inline_calls(messages: list[JsonObject]) -> list[JsonObject]:
    """Assistant calls written into their message's text; tool results wrapped in
    ``<tool_response>`` tags (for templates that render neither)."""
    out = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            text = message.get("content") or ""
            calls = "\n".join(call_text(c) for c in message["tool_calls"])
            rest = {k: v for k, v in message.items() if k != "tool_calls"}
            out.append({**rest, "content": f"{text}\n{calls}" if text else calls})
        elif message.get("role") == "tool" and isinstance(message.get("content"), list):
            # A result with images: its parts kept, between the same tags.
            parts = [
                {"type": "text", "text": "<tool_response>\n"},
                *message["content"],
                {"type": "text", "text": "\n</tool_response>"},
            ]
            out.append({**message, "content": parts})
        elif message.get("role") == "tool":
            content = message.get("content") or ""
            out.append({**message, "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append(message)
    return out


def probe_tools() -> list[JsonObject]:
    return [
        {
            "type": "function",
            "function": {
                "name": PROBE_TOOL,
                "description": "probe",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
