"""Request bodies decoded the way OpenAI validates them: bounded nesting, strict types.

Litestar decodes a JSON body into Python values and then converts them leniently
(``"5"`` becomes ``5``). OpenAI refuses a string where a number belongs, so the body is
also converted strictly against the handler's ``data`` type here; unknown fields are
still accepted (the Structs do not forbid them). A body nested deeper than
``MAX_NESTING`` is refused before anything walks it recursively: msgspec, the
converter and the schema compilers all recurse, and Python's stack ends near 1,000.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import sys
import time
from typing import Any

import msgspec
from litestar import Request
from litestar.types import ASGIApp, Empty, Receive, Scope, Send

from omlx.app.errors import InvalidRequest

# Deeper than any real request: OpenAI allows 10 levels of schema nesting (about 20 of JSON).
MAX_NESTING = 128
# A body this large leaves large transient strings behind (the body, its decoded text, a
# rendered prompt): released once its response is out (``release_large_bodies``).
LARGE_BODY_BYTES = 1 << 20
_RELEASE_EVERY_S = 0.1
_LARGE = "omlx_large_body"
_released_at = 0.0


class TooDeep(InvalidRequest):
    """The body nests arrays and objects deeper than the server walks."""


def nesting_depth(value: Any, limit: int) -> int:
    """How deep ``value``'s arrays and objects nest, counting stops once past ``limit``.

    Iterative, so a hostile body cannot exhaust the stack here.
    """
    if not isinstance(value, dict | list):
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


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
    return TooDeep(
        f"the request body is nested too deeply: at most {MAX_NESTING} levels of arrays and objects"
    )


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
            body = await self.body()
            if len(body) >= LARGE_BODY_BYTES:
                self.scope.setdefault("state", {})[_LARGE] = True  # type: ignore[typeddict-item]
            self._connection_state.json = decode_body(body, data_type)
        return await super().json()


def release_large_bodies(app: ASGIApp) -> ASGIApp:
    """Middleware: once a large body's request is answered (refused or not), free what it
    left behind, so RSS falls back.

    A refused prompt's text is held by reference cycles (the exception's traceback and
    its frames) until the cyclic collector runs, and glibc keeps freed heap pages in each
    thread's arena. At most every tenth of a second, whatever the traffic.
    """

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await app(scope, receive, send)
        finally:
            if scope.get("state", {}).get(_LARGE):
                _release()

    return middleware


def _release() -> None:
    global _released_at
    if time.monotonic() - _released_at < _RELEASE_EVERY_S:
        return
    _released_at = time.monotonic()
    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError, TypeError):  # musl: no malloc_trim
            ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
