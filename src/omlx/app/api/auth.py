"""API-key auth: ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (or Basic, for browsers) on every route but /health."""

from __future__ import annotations

import base64
import binascii
import hmac

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from omlx.app.errors import Unauthorized

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


TENANT_STATE = "omlx_tenant"  # the ASGI state key of the request's tenant (None: default)


def api_key_guard(api_key: str, tenants: dict[str, str] | None = None) -> Guard:
    """A guard that refuses requests without a known key with a 401 in the route's envelope.

    ``api_key`` (may be empty) is the default tenant's; ``tenants`` maps more keys to
    their tenants (``--api-keys-file``). The tenant is left on the request's state.
    """
    known = [(api_key.encode(), None)] if api_key else []
    known += [(key.encode(), tenant) for key, tenant in (tenants or {}).items()]

    def guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
        if handler.opt.get(PUBLIC):
            return
        key = presented_key(connection)
        if key is None:
            raise Unauthorized(
                "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                code="invalid_api_key",
            )
        sent = key.encode()
        found = False
        tenant = None
        for expected, owner in known:  # compare with every key: the time tells no key apart
            if hmac.compare_digest(sent, expected):
                found, tenant = True, owner
        if not found:
            raise Unauthorized("invalid API key", code="invalid_api_key")
        connection.scope.setdefault("state", {})[TENANT_STATE] = tenant  # type: ignore[typeddict-item]

    return guard


def tenant_of(connection: ASGIConnection) -> str | None:
    """The request's tenant, from its key (None: the default one)."""
    return connection.scope.get("state", {}).get(TENANT_STATE)  # type: ignore[union-attr]
