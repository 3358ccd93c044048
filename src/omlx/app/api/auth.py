"""API-key auth: ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (or Basic, for browsers)
on every route but /health, and roles: a tenant's key acts on its own cache, an operator's
on the whole server (routes marked ``OPERATOR``)."""

from __future__ import annotations

import base64
import binascii
import hmac

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from omlx.app.cache_controls.tenants import LOCAL_USER, Caller
from omlx.app.errors import Forbidden, Unauthorized

PUBLIC = "public"  # route opt: reachable without a key


def presented_key(connection: ASGIConnection) -> str | None:
    """The key a client sent, in either header clients use (OpenAI SDKs: Bearer; Anthropic: x-api-key).

    Basic credentials (any user name, the key as password) are what a browser sends once
    its login prompt for ``/dashboard`` has been answered; it resends them on the page's
    own requests.
    """
    if key := connection.headers.get("x-api-key"):
        return key.strip()
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if scheme.lower() == "basic" and token.strip():
        try:
            _, _, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password or None
    return None


CALLER_STATE = "omlx_caller"  # the ASGI state key of the request's ``Caller``
OPERATOR = "operator"  # route opt: only an operator's key may call it


def key_guard(api_key: str, keys: dict[str, Caller] | None = None) -> Guard:
    """A guard that names each request's caller, and refuses what the caller may not do.

    ``api_key`` (may be empty) is the default tenant's operator key; ``keys`` maps more
    keys to their callers (``--api-keys-file``). With no key at all, every request is the
    local user's, an operator. A request without a known key gets a 401 in the route's
    envelope; a tenant's key on an operator route a 403.
    """
    known = [(api_key.encode(), LOCAL_USER)] if api_key else []
    known += [(key.encode(), caller) for key, caller in (keys or {}).items()]

    def guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
        caller = _identify(connection, known) if known else LOCAL_USER
        if caller is None:
            if handler.opt.get(PUBLIC):
                return
            _refuse(connection)
        connection.scope.setdefault("state", {})[CALLER_STATE] = caller  # type: ignore[typeddict-item]
        if handler.opt.get(OPERATOR) and not caller.operator:
            raise Forbidden(
                "this action is the operator's: a tenant's key acts on its own cache only",
                code="operator_only",
            )

    return guard


def _identify(connection: ASGIConnection, known: list[tuple[bytes, Caller]]) -> Caller | None:
    key = presented_key(connection)
    if key is None:
        return None
    sent, found = key.encode(), None
    for expected, caller in known:  # compare with every key: the time tells no key apart
        if hmac.compare_digest(sent, expected):
            found = caller
    return found


def _refuse(connection: ASGIConnection) -> None:
    if presented_key(connection) is None:
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
            code="invalid_api_key",
        )
    raise Unauthorized("invalid API key", code="invalid_api_key")


def caller_of(connection: ASGIConnection) -> Caller | None:
    """The request's caller, from its key (None: a public route called without one)."""
    return connection.scope.get("state", {}).get(CALLER_STATE)  # type: ignore[union-attr]


def tenant_of(connection: ASGIConnection) -> str | None:
    """The request's tenant, from its key (None: the default one)."""
    caller = caller_of(connection)
    return caller.tenant if caller is not None else None


def is_operator(connection: ASGIConnection) -> bool:
    """Whether the request's key may act on the whole server."""
    caller = caller_of(connection)
    return caller is not None and caller.operator
