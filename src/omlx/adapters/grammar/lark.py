"""Output grammars as llguidance's Lark dialect: JSON answers and tool calls, reasoning first.

Markers that are one special token are written ``<[id]>`` (a string literal never matches
a special token); others are string literals. JSON is written with the separators
``json.dumps`` uses and no other whitespace: small models given free whitespace wander
into it and never finish.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from omlx.domain.grammar import GrammarError, OutputGrammar, ToolSpec

# Between a marker and what it frames (``<tool_call>\n{...}\n</tool_call>``, ``</think>\n\n``).
_GAP = r"/[ \n]{0,2}/"


def json_options(strict: bool) -> dict[str, Any]:
    """llguidance's JSON compile options, as the ``x-guidance`` key of a schema."""
    return {
        "whitespace_flexible": False,
        "item_separator": ", ",
        "key_separator": ": ",
        # strict: a keyword llguidance cannot enforce refuses the schema; else it is ignored.
        "lenient": not strict,
    }


def with_options(schema: dict[str, Any] | bool, strict: bool) -> dict[str, Any]:
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object")
    return {**schema, "x-guidance": json_options(strict)}


def call_schema(tools: tuple[ToolSpec, ...]) -> dict[str, Any]:
    """One call to any of ``tools``: ``{"name": <one of them>, "arguments": <its schema>}``."""
    options = []
    for tool in tools:
        try:
            parameters = json.loads(tool.parameters)
        except ValueError as exc:
            raise GrammarError(f"the parameters of tool {tool.name!r} are not JSON") from exc
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def lark_grammar(grammar: OutputGrammar, literal: Callable[[str], str]) -> str:
    """The grammar text; ``literal(marker)`` writes a marker as Lark (special token or string)."""
    if grammar.json_schema is not None:
        try:
            schema = json.loads(grammar.json_schema)
        except ValueError as exc:
            raise GrammarError("the JSON schema is not JSON") from exc
        body = f"%json {json.dumps(with_options(schema, grammar.strict))}"
        rules = [f"answer: {body}"]
        main = "answer"
    else:
        body = f"%json {json.dumps(with_options(call_schema(grammar.tools), grammar.strict))}"
        rules = [f"call_body: {body}"]
        if grammar.call_markers is not None:
            start, end = (literal(m) for m in grammar.call_markers)
            rules.append(f"call: {start} GAP call_body GAP {end}")
        else:
            rules.append("call: call_body")
        main = "call (GAP call)*" if grammar.several_calls and grammar.call_markers else "call"
    prefix = ""
    if grammar.think is not None:
        open_, close = grammar.think
        rules.append(_reasoning_rule(close, literal))
        prefix = "reasoning GAP " if grammar.in_reasoning else f"({literal(open_)} reasoning GAP)? "
    return "\n".join(["%llguidance {}", f"start: {prefix}{main}", *rules, f"GAP: {_GAP}", ""])


def _reasoning_rule(close: str, literal: Callable[[str], str]) -> str:
    written = literal(close)
    if written.startswith("<["):  # a special token ends it: free text, then that token
        return f"reasoning: REASONING_TEXT {written}\nREASONING_TEXT: /(.|\\n)*/"
    # A text marker: the shortest text that ends with it.
    return f"reasoning[suffix={written}]: /(.|\\n)*/"
