"""The grammar a chat turn's output must follow: a JSON answer, or a forced tool call.

A forced call (``tool_choice`` required or naming a tool) is written in the model's own
tool-call syntax (``tool_calls.formats``: the text around each call's arguments, and
around the calls), so the usual parser reads it back; a family only mlx-lm's parser
knows is forced in omlx's fallback syntax (Hermes ``<tool_call>``). A reasoning model may
reason first, between its own markers.

A forced call's arguments follow the tool's schema, closed: an object schema that does
not say ``additionalProperties`` gets ``false``, so a call ends when its arguments do
instead of inventing keys until ``max_tokens``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omlx.app.chat.output import OutputFormat
from omlx.app.chat.tool_calls import HERMES, ToolCallFormat
from omlx.app.errors import InvalidRequest
from omlx.domain.grammar import CallShape, OutputGrammar
from omlx.domain.json_values import JsonObject


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """The answer as JSON: matching ``schema``, or any JSON object when it is None."""

    schema: JsonObject | None = None
    strict: bool = False  # True: a schema keyword that cannot be enforced is a 400
    param: str = "response_format"  # the request field named in errors


def canonical(schema: Any) -> str:
    # Key order kept: JSON objects are generated in the schema's property order.
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def forced_format(fmt: OutputFormat) -> ToolCallFormat:
    """The syntax a forced call is written in for this model."""
    calls = fmt.calls
    return calls if calls is not None and calls.forced_here else HERMES


def closed(schema: Any) -> Any:
    """``schema`` with every object that lists ``properties`` but says nothing of other keys
    closed (``additionalProperties: false``). ``allOf`` branches are left open: closing each
    would refuse the keys the others add."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: JsonObject = {}
    for key, value in schema.items():
        if key == "allOf":
            out[key] = value
        elif key in ("properties", "$defs", "definitions", "patternProperties"):
            out[key] = (
                {k: closed(v) for k, v in value.items()} if isinstance(value, dict) else value
            )
        elif key in ("items", "anyOf", "oneOf", "prefixItems", "additionalProperties", "not"):
            out[key] = closed(value)
        else:
            out[key] = value
    open_keys = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    if "properties" in out and not any(k in out for k in open_keys):
        out["additionalProperties"] = False
    return out


def output_grammar(
    *,
    fmt: OutputFormat,
    in_reasoning: bool,
    response_format: ResponseFormat | None,
    tool_mode: str,
    tool_name: str | None,
    tools: list[JsonObject] | None,
    parallel: bool,
) -> tuple[OutputGrammar, str] | None:
    """The turn's grammar and the request field that asked for it; None: the output is free."""
    think = fmt.think
    if tool_mode in ("required", "function") and tools:
        functions = [t["function"] for t in tools]
        if tool_mode == "function":
            functions = [f for f in functions if f["name"] == tool_name]
        calls = forced_format(fmt)
        if calls.think is not None:
            think = None  # reasoning is a channel of its own (harmony): the call comes first
        shapes = tuple(
            CallShape(
                f["name"],
                calls.before(f["name"]),
                canonical(closed(_parameters(f))),
                calls.after,
                calls.pairs,
            )
            for f in functions
        )
        grammar = OutputGrammar(
            calls=shapes,
            opening=calls.opening,
            between=calls.between,
            closing=calls.closing,
            several_calls=tool_mode == "required" and parallel and calls.several,
            think=think,
            in_reasoning=in_reasoning,
            strict=all(f.get("strict") is True for f in functions),
        )
        return grammar, "tool_choice"
    if response_format is not None:
        schema = (
            response_format.schema if response_format.schema is not None else {"type": "object"}
        )
        if not isinstance(schema, dict | bool):
            raise InvalidRequest("the JSON schema must be an object", param=response_format.param)
        grammar = OutputGrammar(
            json_schema=canonical(schema),
            think=think,
            in_reasoning=in_reasoning,
            strict=response_format.strict,
        )
        return grammar, response_format.param
    return None


def _parameters(function: JsonObject) -> Any:
    parameters = function.get("parameters")
    return parameters if parameters else {"type": "object", "properties": {}}
