"""Render a model's Jinja chat template as Hugging Face's tokenizers do, without transformers.

The prompt a template renders decides the model's input and every cache key after it, so
this must give the text ``transformers``' ``apply_chat_template(..., tokenize=False)``
gives, byte for byte: the same sandboxed environment (blocks trimmed, loop controls, the
``{% generation %}`` tag accepted), the same helpers (``raise_exception``,
``strftime_now``, ``tojson`` keeping non-ASCII text), the special tokens as variables,
messages with their ``None`` values dropped and reasoning under each of its names, and a
named template chosen as it chooses (``tool_use`` when tools are given, else ``default``).
``tests/unit/test_json_tokenizer.py`` holds it to ``transformers`` on real templates.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: training templates mark the assistant's
    tokens with it; a prompt renders its body as it is."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compiled(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def choose(template: str | Mapping[str, str], tools: Any) -> str:
    """The template to render: the one, or of named ones ``tool_use`` (with tools) or ``default``."""
    if isinstance(template, str):
        return template
    if tools is not None and "tool_use" in template:
        return template["tool_use"]
    if "default" in template:
        return template["default"]
    raise ValueError(
        f"this model has several chat templates and none named default: {sorted(template)}"
    )


def plain(value: Any) -> Any:
    """Plain JSON data only: what a sandboxed template may see of the caller's objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as templates see it: ``None`` values dropped, reasoning under each name."""
    if not isinstance(message, Mapping):
        raise TypeError(f"chat messages must be objects, got {message!r}")
    out = {k: v for k, v in message.items() if v is not None}
    reasoning = next((out[k] for k in REASONING_FIELDS if out.get(k) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def render(
    template: str | Mapping[str, str],
    messages: Sequence[Mapping[str, Any]],
    *,
    special_tokens: Mapping[str, str],
    tools: Sequence[Any] | None = None,
    documents: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    **kwargs: Any,
) -> str:
    """The prompt text ``template`` makes of ``messages`` (see the module's docstring)."""
    if not messages:
        raise ValueError("cannot apply a chat template to an empty conversation")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt do not go together")
    if tools is not None and any(not isinstance(t, Mapping) for t in tools):
        raise ValueError("tools must be JSON schemas (objects)")
    source = choose(template, tools)
    chat = plain([_message(m) for m in messages])
    final = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = chat[-1].get(field)
        if not isinstance(final, str):
            raise ValueError(f'continue_final_message: the final message has no text "{field}"')
        chat[-1][field] = final + _CONTINUE_TAG
    variables = {**special_tokens, **plain(kwargs)}
    text = compiled(source).render(
        messages=chat,
        tools=plain(list(tools)) if tools is not None else None,
        documents=plain(list(documents)) if documents is not None else None,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )
    if final is not None:
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise ValueError("continue_final_message: the template dropped the final message")
        at = text.rindex(tag)
        text = (
            text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
        )
    return text
