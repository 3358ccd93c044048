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


def api_key_guard(api_key: str) -> Guard:
    """A guard that refuses requests without ``api_key`` with a 401 in the route's envelope."""
    expected = api_key.encode()

    def guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
        if handler.opt.get(PUBLIC):
            return
        key = presented_key(connection)
        if key is None:
            raise Unauthorized(
                "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                code="invalid_api_key",
            )
        if not hmac.compare_digest(key.encode(), expected):
            raise Unauthorized("invalid API key", code="invalid_api_key")

    return guard
