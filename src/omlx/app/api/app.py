"""``create_app(container) -> Litestar``: routes, auth, metrics, error envelopes, OpenAPI."""

from __future__ import annotations

import asyncio

import anyio
from litestar import Litestar, Request
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from omlx import __version__
from omlx.app.api.anthropic.controller import AnthropicController
from omlx.app.api.auth import key_guard, tenant_of
from omlx.app.api.body import CheckedRequest, release_large_bodies
from omlx.app.api.browser_guard import BrowserGuard, BrowserTrust, frame_guard
from omlx.app.api.cache_controller import CacheController
from omlx.app.api.cache_edge import add_cache_header
from omlx.app.api.dashboard import (
    ApiFamily,
    Dashboard,
    DashboardController,
    DashboardPageController,
    RequestSeries,
)
from omlx.app.api.encoding import EncodingController
from omlx.app.api.errors import EXCEPTION_HANDLERS
from omlx.app.api.health import HealthController
from omlx.app.api.metrics import Metrics, MetricsController, RequestMetrics, count_unmatched
from omlx.app.api.openai.controller import OpenAIController
from omlx.app.api.responses.controller import ResponsesController
from omlx.app.api.stopping import RefuseWhileStopping
from omlx.app.api.translators import Translators
from omlx.app.cache_controls.tenants import Caller, load_keys
from omlx.app.chat.image_reader import ImageReader
from omlx.app.chat.images import ImageLimits
from omlx.app.ops.request_log import RequestLog
from omlx.app.ops.status import ServerStatus
from omlx.app.settings import Settings
from omlx.app.wiring.container import Container
from omlx.domain.responses import ResponseStore, TenantResponses


def create_app(container: Container, keys: dict[str, Caller] | None = None) -> Litestar:
    """The app over ``container``; ``keys``: the keys file read already (else read here)."""
    settings = container.settings
    if keys is None and settings.api_keys_file:
        keys = load_keys(settings.api_keys_file, settings.api_key)
    status = ServerStatus(container)
    metrics = Metrics(status)
    request_log = RequestLog()
    dashboard = Dashboard(
        request_log, RequestSeries(request_log, settings.dashboard_sample_seconds)
    )
    # Every model, loaded now or later, reports through the root's hub.
    container.observers.generations.append(metrics)
    container.observers.misses.append(metrics)
    container.observers.recorders.append(request_log.record)
    browser = BrowserTrust(settings.host, settings.allowed_hosts, settings.allowed_origins)
    tasks: list[asyncio.Task] = []

    async def start_tasks() -> None:
        if container.pool.idle_timeout:
            tasks.append(asyncio.create_task(container.pool.reap_idle()))
        tasks.append(asyncio.create_task(dashboard.series.run()))

    async def start_loads() -> None:  # the port is open: now the models named at start
        for spec in container.start_loads:
            tasks.append(asyncio.create_task(container.pool.load_at_start(spec)))
        container.start_loads = []

    async def stop_tasks() -> None:
        for task in tasks:
            task.cancel()

    async def close() -> None:
        # Loads under way end first, so what they load is closed with the rest. Closing
        # (engines, the writer's drain, the hot set's record) runs off the loop: a second
        # SIGINT is still heard meanwhile (stopping_server.StoppingServer).
        await container.pool.finish_loads()
        await anyio.to_thread.run_sync(container.close)

    return Litestar(
        route_handlers=[
            HealthController,
            OpenAIController,
            ResponsesController,
            AnthropicController,
            EncodingController,
            MetricsController,
            DashboardPageController,
            DashboardController,
            CacheController,
        ],
        dependencies=_providers(
            pool=container.pool,
            translate=Translators(container.normalizer, container.seal, _image_reader(settings)),
            maintenance=container.maintenance,
            settings=settings,
            started_at=container.started_at,
            status=status,
            metrics=metrics,
            dashboard=dashboard,
            browser=browser,
        )
        | {"responses": _tenant_responses(container.responses)},
        guards=[key_guard(settings.api_key, keys)],
        # BrowserGuard and the stop's 503s after the metrics, so their refusals are counted;
        # before the key's guard.
        middleware=[
            release_large_bodies,
            RequestMetrics(metrics),
            RefuseWhileStopping(container.stop),
            BrowserGuard(browser),
            ApiFamily(),
        ],
        before_send=[count_unmatched(metrics), add_cache_header, frame_guard],
        exception_handlers=EXCEPTION_HANDLERS,
        request_class=CheckedRequest,  # nesting bounded, types strict (api.body)
        request_max_body_size=settings.max_request_body_bytes,
        openapi_config=OpenAPIConfig(
            title="omlx",
            version=__version__,
            path="/schema",
            description="OpenAI- and Anthropic-compatible inference on MLX with a persistent prefix cache.",
        ),
        on_startup=[start_tasks, start_loads],
        on_shutdown=[stop_tasks, close],
        debug=False,
        # The CLI configures logging (format, --log-level); Litestar's default config would
        # replace it with its own at INFO and drop the engine's debug lines.
        logging_config=None,
    )


def _image_reader(settings: Settings) -> ImageReader:
    return ImageReader(
        ImageLimits(
            max_pixels=settings.max_image_pixels,
            max_bytes=settings.max_image_bytes,
            max_images=settings.max_images_per_request,
            allow_urls=settings.allow_image_urls,
            url_timeout_s=settings.image_url_timeout_s,
        )
    )


def _providers(**services: object) -> dict[str, Provide]:
    """Each service a handler may ask for by its parameter's name (litestar's ``Provide``)."""

    def provider(value: object) -> Provide:
        return Provide(lambda: value, sync_to_thread=False, use_cache=True)

    return {name: provider(value) for name, value in services.items()}


def _tenant_responses(store: ResponseStore) -> Provide:
    """``responses`` as the request's tenant sees the store: its own responses alone."""

    def provide(request: Request) -> ResponseStore:
        return TenantResponses(store, tenant_of(request))

    return Provide(provide, sync_to_thread=False)
