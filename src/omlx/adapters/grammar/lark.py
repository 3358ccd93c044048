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

from omlx.adapters.grammar.one_of import rewrite_one_of
from omlx.domain.grammar import CallShape, GrammarError, OutputGrammar, PairStyle

# After a reasoning section's end marker (``</think>\n\n``), and around call markers.
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
    """The schema as llguidance compiles it: its options added, exclusive ``oneOf`` as ``anyOf``."""
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object")
    return {**rewrite_one_of(schema), "x-guidance": json_options(strict)}


def _json(schema: Any, strict: bool) -> str:
    return f"%json {json.dumps(with_options(schema, strict))}"


def _parameters(call: CallShape) -> Any:
    try:
        return json.loads(call.parameters)
    except ValueError as exc:
        raise GrammarError(f"the parameters of tool {call.name!r} are not JSON") from exc


def _sequence(pieces: tuple[str, ...], literal: Callable[[str], str]) -> list[str]:
    """Pieces as Lark; a piece of whitespace only is a GAP (up to two spaces or newlines,
    none included), as models differ in what they put around their markers."""
    return ["GAP" if not p.strip() else literal(p) for p in pieces if p]


def _pair_rules(rule: str, schema: Any, style: PairStyle, strict: bool) -> list[str]:
    """``rule`` as key-by-key arguments: required keys in order, optional ones (without a
    separator) optional; each value a raw or quoted string, or JSON."""
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    required = set(schema.get("required", ())) if isinstance(schema, dict) else set()
    rules, parts = [], []
    for i, (key, sub) in enumerate(properties.items()):
        if style.separator and key not in required:
            continue  # joined by a separator, only the required keys are written
        value = f"{rule}_v{i}"
        if isinstance(sub, dict) and sub.get("type") == "string" and not sub.get("enum"):
            text = "/[^<]*/"
            quote = style.quote
            rules.append(
                f"{value}: {_lark_string(quote[0])} {text} {_lark_string(quote[1])}"
                if quote
                else f"{value}: {text}"
            )
        else:
            rules.append(f"{value}: {_json(sub, strict)}")
        pair = " ".join(
            s
            for s in (
                _lark_string(style.key_open),
                _lark_string(key),
                _lark_string(style.key_close),
                value,
                _lark_string(style.value_close) if style.value_close else "",
            )
            if s
        )
        rules.append(f"{rule}_p{i}: {pair}")
        parts.append(f"{rule}_p{i}" + ("" if key in required or style.separator else "?"))
    joiner = f" {_lark_string(style.separator)} " if style.separator else " "
    empty = '""'
    rules.append(f"{rule}: {joiner.join(parts) if parts else empty}")
    return rules


def lark_grammar(grammar: OutputGrammar, literal: Callable[[str], str]) -> str:
    """The grammar text; ``literal(marker)`` writes a marker as Lark (special token or string)."""
    if grammar.json_schema is not None:
        try:
            schema = json.loads(grammar.json_schema)
        except ValueError as exc:
            raise GrammarError("the JSON schema is not JSON") from exc
        rules = [f"answer: {_json(schema, grammar.strict)}"]
        main = "answer"
    else:
        rules, names = [], []
        for i, call in enumerate(grammar.calls):
            args = f"args{i}"
            if call.pairs is not None:
                rules += _pair_rules(args, _parameters(call), call.pairs, grammar.strict)
            else:
                rules.append(f"{args}: {_json(_parameters(call), grammar.strict)}")
            body = [*_sequence(call.before, literal), args, *_sequence(call.after, literal)]
            rules.append(f"call{i}: {' '.join(body)}")
            names.append(f"call{i}")
        rules.append(f"call: {' | '.join(names)}")
        between = " ".join(_sequence(grammar.between, literal))
        calls = f"call ({between} call)*" if grammar.several_calls else "call"
        main = " ".join(
            [*_sequence(grammar.opening, literal), calls, *_sequence(grammar.closing, literal)]
        )
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


def _lark_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
