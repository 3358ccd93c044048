"""What keeps a web page from driving the server through its visitor's browser.

A page on any site can make the browser send requests to ``127.0.0.1:8000``: simple
cross-site ones (a form, a ``no-cors`` fetch: ``text/plain`` or form bodies, the browser's
stored Basic credentials attached), or, after DNS rebinding, same-origin ones to a name that
resolves here. ``BrowserGuard`` refuses each, before the key is even looked at:

- a ``Host`` that is not a name of this server (rebinding needs the attacker's own name);
- an ``Origin`` that is not this server's own or one the operator listed (browsers send
  ``Origin`` on every cross-origin request but a plain GET; tools and SDKs send none);
- Basic credentials on a request that changes something, unless the browser shows it came
  from this server's own page (``Origin``, ``Sec-Fetch-Site`` or ``Referer``) or it carries
  the dashboard's token: Bearer and ``x-api-key`` need a header no cross-site request can add;
- a POST, PUT or PATCH body that is not JSON (or the route's own type): the types a form or
  a ``no-cors`` fetch may send are exactly the ones refused.

Refusals use each API's error envelope; ``frame_guard`` keeps every answer out of frames.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

import msgspec
from litestar.connection import ASGIConnection
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from omlx.app.api.auth import presented_key
from omlx.app.api.errors import error_body

ANY = "*"  # in allowed_hosts / allowed_origins: that check is off
CSRF_HEADER = "x-omlx-csrf"
BODY_TYPES = "body_types"  # route opt: the media types a route takes instead of JSON
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "*"})
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class BrowserTrust:
    """Which hosts and origins this server answers, and the dashboard's CSRF token."""

    def __init__(
        self, bound_host: str, allowed_hosts: Iterable[str], allowed_origins: Iterable[str]
    ) -> None:
        extra_hosts = {_host_name(h) for h in allowed_hosts}
        self.any_host = ANY in extra_hosts
        self.hosts = frozenset(extra_hosts | set(_own_names(bound_host)))
        origins = {normal_origin(o) for o in allowed_origins}
        self.any_origin = ANY in origins
        self.origins = frozenset(origins - {ANY})
        self._secret = secrets.token_bytes(32)  # one per process: a restart renews every token

    def host_allowed(self, host: str) -> bool:
        """A name of this server, an address (DNS rebinding needs a name), or a listed name."""
        name = _host_name(host)
        if self.any_host or name in self.hosts:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def origin_listed(self, origin: str) -> bool:
        return normal_origin(origin) in self.origins

    def csrf_token(self, key: str | None) -> str:
        """The token the dashboard page sends back; bound to the key the page was opened with."""
        return hmac.new(self._secret, (key or "").encode(), hashlib.sha256).hexdigest()[:32]


def normal_origin(origin: str) -> str:
    """``scheme://host[:port]`` as browsers send it: lower case, no trailing slash."""
    return origin.strip().rstrip("/").lower()


def _host_name(host: str) -> str:
    """The name in a ``Host`` header: no port, no IPv6 brackets, no trailing dot, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:  # name:port (an IPv6 address alone has several colons)
        host = host.partition(":")[0]
    return host.rstrip(".")


def _own_names(bound_host: str) -> list[str]:
    names = list(_LOOPBACK_NAMES)
    if bound_host.strip() not in _WILDCARD_BINDS:
        names.append(_host_name(bound_host))
    machine = socket.gethostname().lower()
    names += [machine, machine.partition(".")[0]]  # "mac.local" answers as "mac" too
    return [n for n in names if n]


class Refused(Exception):
    """A request a browser may have been made to send; ``status`` and the client's fix."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


def check(trust: BrowserTrust, connection: ASGIConnection, body_types: tuple[str, ...]) -> None:
    """Raise ``Refused`` for a request that breaks one of the module's rules."""
    headers = connection.headers
    method = connection.scope["method"]
    host = headers.get("host", "")
    if host and not trust.host_allowed(host):
        raise Refused(
            421,
            f"this server does not answer to the name {_host_name(host)!r} (Host header); "
            "an operator adds it with --allowed-host (allowed_hosts)",
            "host_not_allowed",
        )
    origin = headers.get("origin")
    same_origin = bool(host) and origin is not None and _authority(origin) == host.lower()
    if origin is not None and not (same_origin or trust.any_origin or trust.origin_listed(origin)):
        raise Refused(
            403,
            f"requests from web pages at {origin!r} are refused (Origin header); "
            "an operator allows one with --allowed-origin (allowed_origins)",
            "origin_not_allowed",
        )
    if method not in _SAFE_METHODS and _sends_basic(connection):
        from_own_page = (
            same_origin
            or (origin is not None and trust.origin_listed(origin))
            or (origin is None and _from_own_page_without_origin(connection, host))
        )
        token = headers.get(CSRF_HEADER, "")
        expected = trust.csrf_token(presented_key(connection))
        if not from_own_page and not hmac.compare_digest(token.encode(), expected.encode()):
            raise Refused(
                403,
                "Basic credentials (a browser's dashboard login) are accepted on this request "
                "only from the dashboard's own page; scripts send the key as "
                "'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                "csrf_check_failed",
            )
    if method in _BODY_METHODS:
        sent = headers.get("content-type", "").split(";")[0].strip().lower()
        if not _accepted(sent, body_types):
            wanted = " or ".join(body_types) if body_types else "application/json"
            raise Refused(
                415,
                f"this route takes Content-Type: {wanted}, not {sent or 'none'!r} "
                "(with curl: --json, or -H 'Content-Type: application/json')",
                "unsupported_media_type",
                param="content-type",
            )


def _accepted(media_type: str, body_types: tuple[str, ...]) -> bool:
    if body_types:
        return media_type in body_types
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def _sends_basic(connection: ASGIConnection) -> bool:
    """Whether the key, if any, comes from Basic credentials (``auth.presented_key``'s order)."""
    if connection.headers.get("x-api-key"):
        return False
    scheme = connection.headers.get("authorization", "").partition(" ")[0]
    return scheme.lower() == "basic"


def _from_own_page_without_origin(connection: ASGIConnection, host: str) -> bool:
    """A browser that sent no ``Origin`` still tells where the request came from."""
    if connection.headers.get("sec-fetch-site", "").lower() == "same-origin":
        return True
    referer = connection.headers.get("referer")
    return referer is not None and _authority(referer) == host.lower()


def _authority(url: str) -> str:
    try:
        return urlsplit(url.strip()).netloc.lower()
    except ValueError:
        return ""


class BrowserGuard(ASGIMiddleware):
    """Route middleware: ``check`` each HTTP request; a refusal in the route's error envelope."""

    def __init__(self, trust: BrowserTrust) -> None:
        self.trust = trust

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        if scope["type"] != "http":
            await next_app(scope, receive, send)
            return
        handler = scope.get("route_handler")
        body_types = tuple(handler.opt.get(BODY_TYPES, ())) if handler is not None else ()
        try:
            check(self.trust, ASGIConnection(scope, receive, send), body_types)
        except Refused as refused:
            await _refuse(scope, send, refused)
            return
        await next_app(scope, receive, send)


async def _refuse(scope: Scope, send: Send, refused: Refused) -> None:
    body = msgspec.json.encode(
        error_body(scope["path"], refused.status, refused.message, refused.param, refused.code)
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_FRAME_HEADERS = ((b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"))
_CSP = b"content-security-policy"


async def frame_guard(message: Message, scope: Scope) -> None:
    """A ``before_send`` hook: no answer is shown in another site's frame (clickjacking), nor
    read as another type than it says. A page's own CSP (the dashboard's) is kept."""
    if message["type"] != "http.response.start":
        return
    headers = list(message.get("headers", []))
    names = {bytes(name).lower() for name, _ in headers}
    headers += [(n, v) for n, v in _FRAME_HEADERS if n not in names]
    if _CSP not in names:
        headers.append((_CSP, b"frame-ancestors 'none'"))
    message["headers"] = headers  # type: ignore[typeddict-unknown-key]
