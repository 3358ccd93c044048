"""``GET /dashboard`` (the page), its static files, ``GET /v1/dashboard/state`` and the actions.

Every route here needs the API key like the rest of the API. A browser cannot add a
header to a page it opens, so the page's 401 asks for Basic credentials (any user name,
the key as password), which the browser then sends with the page's own requests too.
Another site's page could make it send them as well: ``api.browser_guard`` accepts them on
the actions only from this page (its origin, or the CSRF token the page is served with),
with a JSON body.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import anyio
import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from omlx.app.api.auth import OPERATOR, caller_of, presented_key, tenant_of
from omlx.app.api.browser_guard import BrowserTrust
from omlx.app.api.cache_controller import Unpinned, pins_of, unpin, usage_of
from omlx.app.api.dashboard.actions import clear_model_cache, unload_model, vacuum_cache
from omlx.app.api.dashboard.series import RequestSeries
from omlx.app.api.dashboard.state import dashboard_state, ssd_usage
from omlx.app.api.errors import handle_app_error
from omlx.app.cache_controls.maintenance import CacheMaintenance
from omlx.app.cache_controls.tenants import LOCAL_USER
from omlx.app.errors import Unauthorized
from omlx.app.models.pool import ModelPool
from omlx.app.ops.request_log import RequestLog, current_api, current_report
from omlx.app.ops.status import ServerStatus
from omlx.app.settings import Settings
from omlx.domain.json_values import JsonObject

# The page's files, served from the package (no build step, nothing from the network).
_STATIC = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
_PAGE_HEADERS = {
    # The page and its files come from here alone; this also keeps them off other sites' frames.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "Cache-Control": "no-store",
}
_TOKEN_SLOT = b'<meta name="omlx-csrf" content="">'


@dataclass(slots=True)
class Dashboard:
    """The dashboard's own state: the request log and the series sampled from it."""

    log: RequestLog
    series: RequestSeries


class VacuumRequest(msgspec.Struct, forbid_unknown_fields=True):
    max_size: str  # e.g. "50GB": evict LRU blocks until the SSD tier holds at most this


def _asset(name: str) -> bytes:
    return resources.files("omlx.app.api.dashboard").joinpath("static", name).read_bytes()


def _ask_for_the_key(request: Request, exc: Unauthorized) -> Response:
    """The page's 401, with the challenge that makes a browser prompt for the key."""
    response = handle_app_error(request, exc)
    response.headers["WWW-Authenticate"] = 'Basic realm="omlx", charset="UTF-8"'
    return response


class DashboardPageController(Controller):
    path = "/dashboard"
    tags = ("dashboard",)
    include_in_schema = False  # a page and its files, not an API
    exception_handlers = {Unauthorized: _ask_for_the_key}  # noqa: RUF012 - Litestar's own class attribute

    @get(operation_id="dashboard", media_type="text/html")
    async def page(self, request: Request, browser: BrowserTrust) -> Response[bytes]:
        # The page sends this token back on its actions (browser_guard's CSRF check).
        token = browser.csrf_token(presented_key(request)).encode()
        html = _asset("dashboard.html").replace(_TOKEN_SLOT, _TOKEN_SLOT[:-2] + token + b'">')
        return Response(html, media_type="text/html", headers=_PAGE_HEADERS)

    @get("/static/{name:str}", operation_id="dashboardAsset")
    async def asset(self, name: str) -> Response[bytes]:
        media_type = _STATIC.get(name)
        if media_type is None:
            from omlx.app.errors import NotFound

            raise NotFound(f"no dashboard file {name!r}")
        return Response(_asset(name), media_type=media_type, headers=_PAGE_HEADERS)


class DashboardController(Controller):
    path = "/v1/dashboard"
    tags = ("dashboard",)

    @get(
        "/state",
        operation_id="dashboardState",
        summary="Models, cache tiers, queue, recent requests and sampled series, as the dashboard shows them",
    )
    async def state(
        self,
        request: Request,
        status: ServerStatus,
        settings: Settings,
        dashboard: Dashboard,
        pool: ModelPool,
        maintenance: CacheMaintenance | None,
    ) -> JsonObject:
        caller = caller_of(request) or LOCAL_USER
        ssd = await anyio.to_thread.run_sync(ssd_usage, maintenance if caller.operator else None)
        pins = pins_of(pool, caller.tenant)
        usage = usage_of(pool, caller.tenant)
        log, series = dashboard.log, dashboard.series
        return dashboard_state(status.read(), settings, log, series, ssd, pins, caller, usage)

    # The actions change the server's state: kept out of the OpenAPI schema, so schema-driven
    # fuzzers (tests/e2e/test_schemathesis.py) do not unload or clear what other tests use.
    @post(
        "/models/{model_id:str}/unload",
        operation_id="dashboardUnload",
        include_in_schema=False,
        opt={OPERATOR: True},
        status_code=200,
    )
    async def unload(self, pool: ModelPool, model_id: str) -> JsonObject:
        return unload_model(pool, model_id)

    @post(
        "/models/{model_id:str}/clear-cache",
        operation_id="dashboardClearCache",
        include_in_schema=False,
        opt={OPERATOR: True},
        status_code=200,
    )
    async def clear_cache(
        self,
        pool: ModelPool,
        maintenance: CacheMaintenance | None,
        model_id: str,
    ) -> JsonObject:
        return await anyio.to_thread.run_sync(clear_model_cache, pool, maintenance, model_id)

    @post(
        "/pins/{pin_id:str}/unpin",
        operation_id="dashboardUnpin",
        include_in_schema=False,
        status_code=200,
    )
    async def unpin(self, request: Request, pool: ModelPool, pin_id: str) -> Unpinned:
        # DELETE /v1/cache/pins/{id}'s own code: a tenant unpins only its own pins.
        return unpin(pool, pin_id, tenant_of(request))

    @post(
        "/vacuum",
        operation_id="dashboardVacuum",
        include_in_schema=False,
        opt={OPERATOR: True},
        status_code=200,
    )
    async def vacuum(self, maintenance: CacheMaintenance | None, data: VacuumRequest) -> JsonObject:
        return await anyio.to_thread.run_sync(vacuum_cache, maintenance, data.max_size)


class ApiFamily(ASGIMiddleware):
    """Names each HTTP request's API family and route for the request log (``current_api``),
    and opens the slot its cache report is noted in (``current_report``)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        handler = scope.get("route_handler")
        if scope["type"] == "http" and handler is not None:
            tags = handler.resolve_tags()
            family = sorted(tags)[0] if tags else ""
            current_api.set((family, scope.get("path_template") or scope.get("path", "")))
            current_report.set({})
        await next_app(scope, receive, send)
