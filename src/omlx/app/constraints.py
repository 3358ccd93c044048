"""The grammar a chat turn's output must follow: a JSON answer, or a forced tool call.

A forced call (``tool_choice`` required or naming a tool) is written in the model's own
syntax when its tool calls are JSON bodies between markers (``<tool_call>{"name": …,
"arguments": …}</tool_call>``, mlx-lm's ``json_tools`` family), so the usual parser reads
it back; for a model with no tool-call syntax, or another one, the whole output is one
bare JSON call that ``OutputSplitter(bare_call=True)`` parses. A reasoning model may
reason first, between its own markers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omlx.app.errors import InvalidRequest
from omlx.app.output import OutputFormat
from omlx.domain.grammar import OutputGrammar, ToolSpec

# mlx-lm tool parsers whose call bodies are {"name": ..., "arguments": ...} JSON.
JSON_CALL_PARSERS = frozenset({"json_tools"})


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """The answer as JSON: matching ``schema``, or any JSON object when it is None."""

    schema: dict[str, Any] | None = None
    strict: bool = False  # True: a schema keyword that cannot be enforced is a 400
    param: str = "response_format"  # the request field named in errors


def writes_json_calls(fmt: OutputFormat) -> bool:
    parser = fmt.tool_parser
    module = getattr(parser, "__module__", "") or ""
    return fmt.tool is not None and module.rpartition(".")[2] in JSON_CALL_PARSERS


def canonical(schema: Any) -> str:
    # Key order kept: JSON objects are generated in the schema's property order.
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def output_grammar(
    *,
    fmt: OutputFormat,
    in_reasoning: bool,
    response_format: ResponseFormat | None,
    tool_mode: str,
    tool_name: str | None,
    tools: list[dict[str, Any]] | None,
    parallel: bool,
) -> tuple[OutputGrammar, str] | None:
    """The turn's grammar and the request field that asked for it; None: the output is free."""
    think = fmt.think
    if tool_mode in ("required", "function") and tools:
        functions = [t["function"] for t in tools]
        if tool_mode == "function":
            functions = [f for f in functions if f["name"] == tool_name]
        specs = tuple(ToolSpec(f["name"], canonical(_parameters(f))) for f in functions)
        markers = fmt.tool if writes_json_calls(fmt) else None
        grammar = OutputGrammar(
            tools=specs,
            several_calls=tool_mode == "required" and parallel and markers is not None,
            call_markers=markers,
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


def _parameters(function: dict[str, Any]) -> Any:
    parameters = function.get("parameters")
    return parameters if parameters else {"type": "object"}
