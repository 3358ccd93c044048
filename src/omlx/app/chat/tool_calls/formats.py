"""Tool-call formats of the model families people run: how a call is framed, read back,
streamed and, for a forced call, written under a grammar.

A format names the text that opens and closes a call (or a section of calls), reads the
calls out of what lies between (``parse``) and, where the arguments are one JSON object
after the tool's name, finds that name and where the arguments start (``header``), so
the arguments can stream as the model writes them. ``before``/``after`` (and ``opening``,
``between``, ``closing``) are the literal text around a forced call's arguments
(``domain.grammar.CallShape``), in the family's syntax.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omlx.domain.grammar import PairStyle
from omlx.domain.json_values import JsonObject

Call = tuple[str, Any]  # a tool's name and its arguments (a dict, or text as written)
Header = Callable[[str, int], "tuple[str, int, int] | None"]  # name, args start, match start


@dataclass(frozen=True, slots=True, eq=False)
class ToolCallFormat:
    """One family's tool-call syntax. ``end`` "" means a call runs to the end of the output."""

    family: str
    start: str
    end: str
    parse: Callable[[str], list[Call]]  # a body's calls; raises ValueError when it has none
    before: Callable[[str], tuple[str, ...]]  # a forced call's text before its arguments
    after: tuple[str, ...] = ()
    header: Header | None = None  # None: the arguments are not one JSON object (no streaming)
    opening: tuple[str, ...] = ()
    between: tuple[str, ...] = ()
    closing: tuple[str, ...] = ()
    several: bool = True  # a forced call may be several calls
    pairs: PairStyle | None = None
    leading_json: bool = False  # a bare JSON call may open the answer (Llama 3.x)
    think: tuple[str, str] | None = None  # the family's reasoning markers (harmony)
    framing: tuple[str, ...] = ()  # message framing that is neither text nor a call
    forced_here: bool = True  # False: a forced call is written (and read) as HERMES


def _name_pattern(keys: str) -> re.Pattern[str]:
    return re.compile(
        r'\s*[\[,]?\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:' + keys + r')"\s*:\s*'
    )


def _regex_header(pattern: re.Pattern[str]) -> Header:
    def header(body: str, pos: int) -> tuple[str, int, int] | None:
        match = pattern.search(body, pos)
        if match is None:
            return None
        name = match.group(1)
        if "\\" in name:  # a JSON string's escapes
            name = json.loads(f'"{name}"')
        return name, match.end(), match.start()

    return header


def _by_header(header: Header, *, whole_json: bool = False) -> Callable[[str], list[Call]]:
    """Calls found header by header, each one's arguments one JSON value; with
    ``whole_json``, a body that is JSON objects in another key order is read whole."""
    decoder = json.JSONDecoder()

    def parse(body: str) -> list[Call]:
        calls, pos = [], 0
        while (found := header(body, pos)) is not None:
            name, at, _ = found
            arguments, pos = decoder.raw_decode(body, at)  # ValueError when cut
            calls.append((name, arguments))
        if not calls and whole_json:
            calls = _json_objects(body)
        if not calls:
            raise ValueError("no tool call in the text")
        return calls

    return parse


def _json_objects(body: str) -> list[Call]:
    value = json.loads(body.strip())
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError("not a tool call")
        calls.append((item["name"], item.get("arguments", item.get("parameters", {}))))
    return calls


def _glm_parser() -> Callable[[str], list[Call]]:
    """GLM's ``name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>`` bodies."""
    pair = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
    head_end = r"\n|<arg_key>"

    def parse(body: str) -> list[Call]:
        name = re.split(head_end, body.strip(), maxsplit=1)[0].strip()
        if not name or not re.fullmatch(r"[\w.\-]+", name):
            raise ValueError("no tool name")
        arguments: JsonObject = {}
        for key, raw in pair.findall(body):
            try:
                arguments[key.strip()] = json.loads(raw)
            except ValueError:
                arguments[key.strip()] = raw
        return [(name, arguments)]

    return parse


def _gemma_parser(quote: str) -> Callable[[str], list[Call]]:
    """Gemma's ``call:name{key:<quote>text<quote>,n:3}`` bodies, read as JSON."""
    call = re.compile(r"call:([\w.\-]+)\{(.*)\}\s*$", re.DOTALL)
    strings = re.compile(re.escape(quote) + r"(.*?)" + re.escape(quote), re.DOTALL)

    def parse(body: str) -> list[Call]:
        match = call.search(body.strip())
        if match is None:
            raise ValueError("no Gemma call")
        kept: list[str] = []
        text = strings.sub(
            lambda m: kept.append(m.group(1)) or f"\x00{len(kept) - 1}\x00", match.group(2)
        )
        text = re.sub(r"(^|[{,])\s*([\w\-]+)\s*:", r'\1"\2":', text)
        text = re.sub(r"\x00(\d+)\x00", lambda m: json.dumps(kept[int(m.group(1))]), text)
        return [(match.group(1), json.loads("{" + text + "}"))]

    return parse


def _json_key(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


_HERMES_HEADER = _regex_header(_name_pattern("arguments|parameters"))
HERMES = ToolCallFormat(
    "hermes",
    "<tool_call>",
    "</tool_call>",
    parse=_by_header(_HERMES_HEADER, whole_json=True),
    header=_HERMES_HEADER,
    before=lambda n: ("<tool_call>", "\n", f'{{"name": {_json_key(n)}, "arguments": '),
    after=("}", "\n", "</tool_call>"),
    between=("\n",),
)

# Llama 3.x: a JSON call as the whole answer, or after <|python_tag|>; ";" between calls.
_LLAMA_HEADER = _regex_header(
    re.compile(
        r'\s*;?\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:parameters|arguments)"\s*:\s*'
    )
)
LLAMA3 = ToolCallFormat(
    "llama3",
    "<|python_tag|>",
    "",
    parse=_by_header(_LLAMA_HEADER, whole_json=True),
    header=_LLAMA_HEADER,
    before=lambda n: (f'{{"name": {_json_key(n)}, "parameters": ',),
    after=("}",),
    several=False,
    leading_json=True,
)

_MISTRAL_JSON_HEADER = _regex_header(
    re.compile(r"\s*(?:\[TOOL_CALLS\])?" + _name_pattern("arguments").pattern)
)
MISTRAL = ToolCallFormat(
    "mistral",
    "[TOOL_CALLS]",
    "",
    parse=_by_header(_MISTRAL_JSON_HEADER, whole_json=True),
    header=_MISTRAL_JSON_HEADER,
    before=lambda n: (f'{{"name": {_json_key(n)}, "arguments": ',),
    after=("}",),
    opening=("[TOOL_CALLS]", "["),
    between=(", ",),
    closing=("]",),
)
# Mistral's newer templates (v11+): [TOOL_CALLS]name[ARGS]{...}, repeated.
_MISTRAL_ARGS_HEADER = _regex_header(
    re.compile(r"\s*(?:\[TOOL_CALLS\])?\s*([\w.\-]+)\s*(?:\[CALL_ID\][\w\-]+)?\s*\[ARGS\]\s*")
)
MISTRAL_ARGS = ToolCallFormat(
    "mistral",
    "[TOOL_CALLS]",
    "",
    parse=_by_header(_MISTRAL_ARGS_HEADER),
    header=_MISTRAL_ARGS_HEADER,
    before=lambda n: ("[TOOL_CALLS]", n, "[ARGS]"),
)

_DS = {k: f"<｜tool▁{k}｜>" for k in ("calls▁begin", "calls▁end", "call▁begin", "call▁end", "sep")}
_DEEPSEEK_HEADER = _regex_header(
    re.compile(r"\s*" + _DS["call▁begin"] + "function" + _DS["sep"] + r"([^\n<]+?)\s*```json\s*")
)
_DEEPSEEK_V31_HEADER = _regex_header(
    re.compile(r"\s*" + _DS["call▁begin"] + r"([^\n<]+?)" + _DS["sep"] + r"\s*")
)
# V3 / R1: function<sep>name, then the arguments in a ```json fence.
DEEPSEEK = ToolCallFormat(
    "deepseek",
    _DS["calls▁begin"],
    _DS["calls▁end"],
    parse=_by_header(_DEEPSEEK_HEADER),
    header=_DEEPSEEK_HEADER,
    before=lambda n: (_DS["call▁begin"], "function", _DS["sep"], f"{n}\n```json", "\n"),
    after=("\n", "```", _DS["call▁end"]),
    opening=(_DS["calls▁begin"],),
    between=("\n",),
    closing=(_DS["calls▁end"],),
)
# V3.1 and later: name<sep>arguments.
DEEPSEEK_V31 = ToolCallFormat(
    "deepseek",
    _DS["calls▁begin"],
    _DS["calls▁end"],
    parse=_by_header(_DEEPSEEK_V31_HEADER),
    header=_DEEPSEEK_V31_HEADER,
    before=lambda n: (_DS["call▁begin"], n, _DS["sep"]),
    after=(_DS["call▁end"],),
    opening=(_DS["calls▁begin"],),
    closing=(_DS["calls▁end"],),
)

# gpt-oss (harmony): <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
_HARMONY_HEADER = _regex_header(
    re.compile(
        r"\s*([\w.\-]+)\s*(?:<\|channel\|>\s*\w+)?\s*(?:<\|constrain\|>)?\s*(?:json)?\s*<\|message\|>"
    )
)
HARMONY = ToolCallFormat(
    "harmony",
    " to=functions.",
    "<|call|>",
    parse=_by_header(_HARMONY_HEADER),
    header=_HARMONY_HEADER,
    before=lambda n: (
        "<|channel|>",
        f"commentary to=functions.{n} ",
        "<|constrain|>",
        "json",
        "<|message|>",
    ),
    after=("<|call|>",),
    several=False,
    think=("<|channel|>analysis<|message|>", "<|end|>"),
    framing=(
        "<|start|>assistant",
        "<|channel|>final",
        "<|channel|>commentary",
        "<|message|>",
        "<|end|>",
        "<|return|>",
    ),
)

GLM = ToolCallFormat(
    "glm",
    "<tool_call>",
    "</tool_call>",
    parse=_glm_parser(),
    before=lambda n: ("<tool_call>", f"{n}\n"),
    after=("</tool_call>",),
    between=("\n",),
    pairs=PairStyle("<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n"),
)

GEMMA4 = ToolCallFormat(
    "gemma",
    "<|tool_call>",
    "<tool_call|>",
    parse=_gemma_parser('<|"|>'),
    before=lambda n: ("<|tool_call>", f"call:{n}{{"),
    after=("}", "<tool_call|>"),
    pairs=PairStyle("", ":", "", ",", ('<|"|>', '<|"|>')),
)
FUNCTION_GEMMA = ToolCallFormat(
    "gemma",
    "<start_function_call>",
    "<end_function_call>",
    parse=_gemma_parser("<escape>"),
    before=lambda n: ("<start_function_call>", f"call:{n}{{"),
    after=("}", "<end_function_call>"),
    pairs=PairStyle("", ":", "", ",", ("<escape>", "<escape>")),
)


def format_of_template(template: str) -> ToolCallFormat | None:
    """The family a chat template's tool-call syntax belongs to; None: no syntax this knows."""
    if _DS["calls▁begin"] in template:
        return DEEPSEEK if "```json" in template else DEEPSEEK_V31
    if "to=functions." in template or "<|channel|>" in template:
        return HARMONY
    if "[TOOL_CALLS]" in template:
        return MISTRAL_ARGS if "[ARGS]" in template else MISTRAL
    if "<arg_key>" in template:
        return GLM
    if "<|tool_call>" in template:
        return GEMMA4
    if "<start_function_call>" in template:
        return FUNCTION_GEMMA
    if "<|python_tag|>" in template or '"parameters": dictionary' in template:
        return LLAMA3
    if "<tool_call>" in template and "<function=" not in template:
        return HERMES
    return None


def opaque_format(start: str, end: str, parser: Callable[[str, Any], Any]) -> ToolCallFormat:
    """A family only mlx-lm's parser reads (Qwen3-Coder, Kimi, MiniMax, …): calls are parsed
    when they close; a forced call is written in omlx's fallback (Hermes) syntax."""

    def parse(body: str) -> list[Call]:
        parsed = parser(body, None)
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise ValueError("not a tool call")
            calls.append((item["name"], item.get("arguments", {})))
        return calls

    return ToolCallFormat(
        "mlx-lm", start, end, parse=parse, before=HERMES.before, forced_here=False
    )
