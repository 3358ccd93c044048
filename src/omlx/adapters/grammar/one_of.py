"""``oneOf`` where llguidance can enforce it: branches no value can match twice.

"Exactly one branch matches" is "at least one matches" (``anyOf``, which llguidance
compiles) when no two branches can match the same value. That is decided here for the
shapes schemas use for it: different types, different ``const``/``enum`` values, a
discriminating property (pydantic's tagged unions), or a key one branch requires and the
other, closed, forbids. Any other ``oneOf`` is left to llguidance, which refuses what it
cannot prove either; ``ONE_OF_ADVICE`` then says what to change.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

_NUMBERS = {"integer", "number"}
_UNSET = object()


ONE_OF_ADVICE = (
    "its branches are not provably exclusive, and constrained decoding cannot enforce that "
    "exactly one matches: use anyOf if either may match, or make the branches exclusive (a "
    "required property with a different const in each, different types, or "
    "additionalProperties: false with a required key the other branch lacks)"
)


def rewrite_one_of(schema: Any) -> Any:
    """``schema`` with every provably exclusive ``oneOf`` turned into ``anyOf`` (one that a
    ``$ref`` points into is kept: renaming it would break the pointer)."""
    refs = {unquote(r) for r in _refs(schema)}
    return _walk(schema, schema, "#", refs)


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [r for n in node for r in _refs(n)]
    if not isinstance(node, dict):
        return []
    found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return found + [r for v in node.values() for r in _refs(v)]


def _walk(node: Any, root: Any, where: str, refs: set[str]) -> Any:
    if isinstance(node, list):
        return [_walk(n, root, f"{where}/{i}", refs) for i, n in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {k: _walk(v, root, f"{where}/{_escape(k)}", refs) for k, v in node.items()}
    branches = out.get("oneOf")
    pointed_at = any(r.startswith(f"{where}/oneOf") for r in refs)
    if (
        isinstance(branches, list)
        and not pointed_at
        and all(
            _exclusive(branches[i], branches[j], root)
            for i in range(len(branches))
            for j in range(i + 1, len(branches))
        )
    ):
        del out["oneOf"]
        if "anyOf" in out:  # both: the value must match one of each list
            out["allOf"] = [*out.get("allOf", []), {"anyOf": branches}]
        else:
            out["anyOf"] = branches
    return out


def _escape(key: str) -> str:
    """A key as a JSON pointer writes it (``~0``, ``~1``; refs may also percent-encode)."""
    return key.replace("~", "~0").replace("/", "~1")


def _resolve(schema: Any, root: Any, depth: int = 0) -> Any:
    """A local ``$ref`` followed (``#/$defs/X``); anything else as it is."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < 16:
        ref = schema["$ref"]
        if not ref.startswith("#"):
            return schema
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                return schema
            target = target[part]
        schema, depth = target, depth + 1
    return schema


def _types(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if isinstance(kind, str):
        kinds = {kind}
    elif isinstance(kind, list):
        kinds = set(kind)
    else:
        values = _values(schema)
        if values is _UNSET:
            return None
        kinds = {_type_of(v) for v in values}
    return kinds | ({"number"} if "integer" in kinds else set())


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if value is None:
        return "null"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "object")


def _values(schema: Any) -> Any:
    """The finite set of values a schema allows (canonical JSON texts' values), or _UNSET."""
    if not isinstance(schema, dict):
        return _UNSET
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return schema["enum"]
    return _UNSET


def _disjoint_values(a: Any, b: Any) -> bool:
    if a is _UNSET or b is _UNSET:
        return False
    keys = {json.dumps(v, sort_keys=True) for v in a}
    return not any(json.dumps(v, sort_keys=True) in keys for v in b)


def _exclusive(a: Any, b: Any, root: Any) -> bool:
    a, b = _resolve(a, root), _resolve(b, root)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not (ta & tb):
        return True
    if _disjoint_values(_values(a), _values(b)):
        return True
    return _objects_exclusive(a, b, root) or _objects_exclusive(b, a, root)


def _objects_exclusive(a: dict[str, Any], b: dict[str, Any], root: Any) -> bool:
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    required_a, required_b = set(a.get("required", ())), set(b.get("required", ()))
    if not isinstance(props_a, dict) or not isinstance(props_b, dict):
        return False
    for key in required_a:
        # A tag: both require it, with values that cannot be the same.
        if key in required_b and _disjoint_values(
            _values(_resolve(props_a.get(key), root)), _values(_resolve(props_b.get(key), root))
        ):
            return True
        # A key b, closed, cannot have.
        if (
            b.get("additionalProperties") is False
            and key not in props_b
            and not b.get("patternProperties")
        ):
            return True
    return False
