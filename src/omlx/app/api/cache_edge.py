"""The cache controls at the HTTP edge: a turn's ``TurnControls``, the ``x-omlx-cache`` header.

A handler readies the request for its prompt's ``CacheReport`` (``note``), which is known
once the engine has restored the prompt's prefix; a ``before_send`` hook adds it as the
header to the response's start, so JSON answers and SSE streams carry it alike. A JSON
answer starts after its generation; a stream starts with its first event, which waits for
the report (``cache_controls.reporting``): only a stream that had to start first (queued
too long) says ``outcome=pending``. No-store is asked by the ``x-omlx-cache-control:
no-store`` header or the body's ``omlx_cache_control: "no-store"``; any other value is
refused by name, never ignored.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from litestar import Request
from litestar.types import Message, Scope

from omlx.app.api.auth import tenant_of
from omlx.app.cache_controls.controls import TurnControls
from omlx.app.cache_controls.hints import Breakpoint
from omlx.app.cache_controls.outcome import PENDING
from omlx.app.cache_controls.report import HEADER, CacheReport
from omlx.app.cache_controls.service import CacheControls
from omlx.app.cache_controls.session_key import choose_session_key
from omlx.app.errors import InvalidRequest
from omlx.app.ops.request_log import current_report
from omlx.domain.json_values import JsonObject

CONTROL_HEADER = "x-omlx-cache-control"
CONTROL_FIELD = "omlx_cache_control"
NO_STORE = "no-store"
_STATE_KEY = "omlx_cache_report"
RECENT_KEY = "omlx_cache_recent"  # the app state's last reports, for a dashboard
RECENT_LIMIT = 100
# A response that started before its prompt was looked up (queued past the report's hold).
PENDING_HEADER = f"outcome={PENDING}"


def no_store(request: Request, field: str | None) -> bool:
    """Whether the request asks not to be stored: its header or its body field says ``no-store``."""
    header = request.headers.get(CONTROL_HEADER)
    for value, name in ((header, CONTROL_HEADER), (field, CONTROL_FIELD)):
        if value is None:
            continue
        directives = {v.strip().lower() for v in value.split(",") if v.strip()}
        unknown = directives - {NO_STORE, "default"}
        if unknown:
            raise InvalidRequest(
                f"{name} accepts 'no-store' or 'default', not {', '.join(sorted(unknown))!r}",
                param=name,
            )
        if NO_STORE in directives:
            return True
    return False


def turn_controls(
    request: Request,
    field: str | None,
    *,
    retention: float | None = None,
    session_key: str | None = None,
    breakpoints: Sequence[Breakpoint] = (),
    metadata: object = None,
) -> TurnControls:
    """The turn's cache controls: the key's tenant, no-store, the body's cache hints, and
    the session it names (its headers, ``session_key`` = ``prompt_cache_key``, Anthropic
    ``metadata``).

    The tenant and the session are noted for the request log too, so the dashboard shows
    each tenant its own.
    """
    session = choose_session_key(request.headers, prompt_cache_key=session_key, metadata=metadata)
    tenant = tenant_of(request)
    slot = current_report.get()
    if slot is not None:
        slot["tenant"] = tenant or ""
        slot["session"] = session.value if session is not None else ""
    return TurnControls(
        tenant=tenant,
        store=not no_store(request, field),
        retention=retention,
        session_key=session_key,
        breakpoints=tuple(breakpoints),
        session=session,
    )


def note(
    request: Request, controls: CacheControls, model: str = ""
) -> Callable[[CacheReport], None] | None:
    """Ready ``request`` for its prompt's report; the function to call with it once known
    (None: the model has no prefix cache, and the response no header).

    Called, it sets the response header's report and fills the request log's record (where
    it diverged) and the recent reports. Until then the header says the report is pending.
    """
    if not controls.enabled:
        return None
    state = request.scope.setdefault("state", {})  # type: ignore[typeddict-item]
    state[_STATE_KEY] = PENDING_HEADER
    slot = current_report.get()  # the request log's record of this request
    app_state = request.app.state
    route, tenant = request.url.path, tenant_of(request) or ""

    def noted(cache: CacheReport) -> None:
        state[_STATE_KEY] = cache
        if slot is not None:
            slot["report"] = cache
        recent: deque[JsonObject] | None = app_state.get(RECENT_KEY)
        if recent is None:
            recent = app_state[RECENT_KEY] = deque(maxlen=RECENT_LIMIT)
        recent.append(
            {"at": time.time(), "route": route, "model": model, "tenant": tenant, **cache.as_json()}
        )

    return noted


def recent_reports(request: Request, tenant: str) -> list[JsonObject]:
    """The last reports of ``tenant``'s requests, newest first (``GET /v1/cache/recent``)."""
    recent = request.app.state.get(RECENT_KEY) or ()
    return [r for r in reversed(recent) if r["tenant"] == tenant]


async def add_cache_header(message: Message, scope: Scope) -> None:
    """A ``before_send`` hook: the noted report as ``x-omlx-cache`` on the response's start."""
    if message["type"] != "http.response.start":
        return
    cache = scope.get("state", {}).get(_STATE_KEY)  # type: ignore[union-attr]
    if cache is None:
        return
    if cache == PENDING_HEADER:
        if message["status"] >= 400:  # refused or failed before any lookup: nothing to say
            return
        value = cache
    else:
        value = cache.header() + ("; store=no" if cache.no_store else "")
    headers = list(message.get("headers", []))
    headers.append((HEADER.encode(), value.encode("latin-1", errors="replace")))
    message["headers"] = headers  # type: ignore[typeddict-unknown-key]
