"""JSON as a model writes it, a token at a time: where a value ends, and a cut one closed.

Streaming a tool call's arguments needs to know where its JSON ends inside the call's body
(``{"name": …, "arguments": {…}}`` goes on after the arguments); a call cut by
``max_tokens`` needs its partial arguments as an object for APIs that return one
(Anthropic's ``tool_use.input``).
"""

from __future__ import annotations

import json
from typing import Any

_CLOSERS = {"{": "}", "[": "]"}


def value_end(text: str, start: int) -> int | None:
    """The end offset of the JSON object or array starting at ``start`` (whitespace
    skipped), or None while it is incomplete. A scalar ends where it is followed by
    something that is not part of it."""
    i = start
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    if i >= len(text):
        return None
    if text[i] not in _CLOSERS:
        try:
            _, end = json.JSONDecoder().raw_decode(text, i)
        except ValueError:
            return None
        return end if end < len(text) else None  # a number may go on with the next token
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def close_partial(text: str) -> Any:
    """The value a cut JSON text was on its way to: open strings and containers closed, a
    dangling key, colon or comma dropped. None when nothing of an object or array is there."""
    stack, in_string, escaped = _scan(text)
    candidate = text.rstrip()
    if in_string:
        candidate = candidate[:-1] if escaped or candidate.endswith("\\") else candidate
        candidate += '"'
    # Drop what cannot stand: trailing commas and colons, then a key without a value.
    for _ in range(4):
        try:
            return json.loads(candidate + "".join(_CLOSERS[c] for c in reversed(stack)))
        except ValueError:
            candidate = _trim_tail(candidate)
            if candidate is None:
                return None
            stack = _open_containers(candidate)
    return None


def _trim_tail(text: str) -> str | None:
    """``text`` less its last incomplete member (a key awaiting its value, a comma, a number cut)."""
    stripped = text.rstrip().rstrip(",:").rstrip()
    if stripped != text.rstrip():
        text = stripped
        if text.endswith('"') and _last_is_key(text):
            text = text[: _string_start(text)].rstrip().rstrip(",").rstrip()
        return text
    for cut in range(len(text) - 1, -1, -1):
        if text[cut] in ",{[":
            return text[: cut + 1].rstrip(",") if text[cut] == "," else text[: cut + 1]
    return None


def _string_start(text: str) -> int:
    """Where the string that ends ``text`` opens."""
    i = len(text) - 2
    while i >= 0:
        if text[i] == '"' and (i == 0 or text[i - 1] != "\\"):
            return i
        i -= 1
    return 0


def _last_is_key(text: str) -> bool:
    before = text[: _string_start(text)].rstrip()
    return before.endswith("{") or (before.endswith(",") and _open_containers(before)[-1:] == ["{"])


def _open_containers(text: str) -> list[str]:
    return _scan(text)[0]


def _scan(text: str) -> tuple[list[str], bool, bool]:
    """The containers ``text`` leaves open, and whether it ends inside a string (after a
    backslash)."""
    stack: list[str] = []
    in_string, escaped = False, False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            stack.append(c)
        elif c in "}]" and stack:
            stack.pop()
    return stack, in_string, escaped
