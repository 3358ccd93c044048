"""Settings mistakes as one line a person can act on: which file, variable or flag, which
key, what was wrong, and the nearest real key when a name is misspelt."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

# msgspec's words for types, as a TOML writer would say them.
_TYPE_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "str": "a string in quotes",
    "bool": "true or false",
    "array": 'a list, e.g. ["a", "b"]',
    "object": "a table",
    "null": "nothing",
}
_MSGSPEC_AT = re.compile(r"^(?P<what>.*?) - at `\$\.(?P<key>\w+)(?P<rest>[^`]*)`$")
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'port'?)`` for the nearest known name, or empty; dashes count as
    underscores, since flags spell keys with dashes."""
    known = list(known)
    spelled = name.replace("-", "_").lower()
    if spelled in known:
        return f" (did you mean {spelled!r}?)"
    close = difflib.get_close_matches(spelled, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_file_keys(source: str, values: Mapping[str, Any], known: Iterable[str]) -> None:
    """ValueError for a section or an unknown key in a settings file, naming the file."""
    known = list(known)
    for key, value in values.items():
        if isinstance(value, dict):
            inner = ", ".join(value) or "none"
            raise ValueError(
                f"{source}: omlx settings are top-level keys, not a [{key}] section: "
                f"remove the [{key}] line and keep its keys ({inner}) at the top of the file"
            )
        if key not in known:
            raise ValueError(
                f"{source}: unknown setting {key!r}{did_you_mean(key, known)}; "
                "config/omlx.toml lists every key"
            )


def describe_invalid(message: str, origins: Mapping[str, str], values: Mapping[str, Any]) -> str:
    """A msgspec validation message (``Expected `int`, got `str` - at `$.port```) as
    ``FILE: port = "80a": expected a whole number, not a string in quotes``."""
    at = _MSGSPEC_AT.match(message)
    if at is None:
        return f"invalid setting: {message}"
    key, what = at["key"], at["what"]
    expected = _EXPECTED.match(what)
    if expected is not None:
        want = " or ".join(_TYPE_WORDS.get(t, t) for t in expected["want"].split(" | "))
        what = f"expected {want}, not {_TYPE_WORDS.get(expected['got'], expected['got'])}"
    else:
        what = what[:1].lower() + what[1:]
    if at["rest"]:  # inside a list: `$.models[1]`
        what = f"item {at['rest'].strip('[]')}: {what}"
    origin = origins.get(key, "settings")
    shown = json.dumps(values[key]) if key in values else "?"
    return f"{origin}: {key} = {shown}: {what}"


def name_origin(message: str, origins: Mapping[str, str]) -> str:
    """Prefix a validation message that starts with a key's name with where that key was set."""
    first = re.match(r"\w+", message)
    origin = origins.get(first.group(0)) if first else None
    return f"{origin}: {message}" if origin else message
