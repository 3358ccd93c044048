"""Request bodies decoded the way OpenAI validates them: bounded nesting, strict types.

Litestar decodes a JSON body into Python values and then converts them leniently
(``"5"`` becomes ``5``). OpenAI refuses a string where a number belongs, so the body is
also converted strictly against the handler's ``data`` type here; unknown fields are
still accepted (the Structs do not forbid them). A body nested deeper than
``MAX_NESTING`` is refused before anything walks it recursively: msgspec, the
converter and the schema compilers all recurse, and Python's stack ends near 1,000.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.types import Empty

from omlx.app.errors import InvalidRequest

# Deeper than any real request: OpenAI allows 10 levels of schema nesting (about 20 of JSON).
MAX_NESTING = 128


class TooDeep(InvalidRequest):
    """The body nests arrays and objects deeper than the server walks."""


def nesting_depth(value: Any, limit: int) -> int:
    """How deep ``value``'s arrays and objects nest, counting stops once past ``limit``.

    Iterative, so a hostile body cannot exhaust the stack here.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list) and c)
    return deepest if isinstance(value, dict | list) else 0


def decode_body(body: bytes, data_type: Any | None) -> Any:
    """The JSON ``body`` as Python values, checked against ``data_type`` with strict types."""
    try:
        value = msgspec.json.decode(body or b"null")
    except RecursionError:
        raise _too_deep() from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if isinstance(value, dict | list) and nesting_depth(value, MAX_NESTING) > MAX_NESTING:
        raise _too_deep()
    if data_type is not None:
        try:
            msgspec.convert(value, data_type, strict=True, str_keys=True)
        except msgspec.ValidationError as exc:
            raise _invalid(str(exc)) from None
    return value


def _too_deep() -> TooDeep:
    return TooDeep(f"the request body is nested too deeply: at most {MAX_NESTING} levels of arrays and objects")


def _invalid(detail: str) -> InvalidRequest:
    """msgspec's ``Expected `int`, got `str` - at `$.max_tokens``` as a message naming the field."""
    message, _, where = detail.partition(" - at `$")
    param = where.rstrip("`").lstrip(".") or None
    if param is None:
        return InvalidRequest(message)
    return InvalidRequest(f"{message} - at `{param}`", param=param)


class CheckedRequest(Request):
    """Litestar's request, whose JSON body goes through ``decode_body`` once."""

    async def json(self) -> Any:
        if self._json is Empty and self._connection_state.json is Empty:
            field = self.route_handler.parsed_data_field
            data_type = field.annotation if field is not None else None
            self._connection_state.json = decode_body(await self.body(), data_type)
        return await super().json()
