"""``create_app(container) -> Litestar``: routes, auth, metrics, error envelopes, OpenAPI."""

from __future__ import annotations

from litestar import Litestar
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from omlx import __version__
from omlx.app.api.anthropic import AnthropicController
from omlx.app.api.auth import api_key_guard
from omlx.app.api.errors import EXCEPTION_HANDLERS
from omlx.app.api.health import HealthController
from omlx.app.api.metrics import Metrics, MetricsController, RequestMetrics, count_unmatched
from omlx.app.api.openai import OpenAIController
from omlx.app.api.responses import ResponsesController
from omlx.app.container import Container


def create_app(container: Container) -> Litestar:
    metrics = Metrics(container)
    container.metrics = metrics
    container.generation.observer = metrics
    container.chat.observer = metrics
    settings = container.settings

    def provide_container() -> Container:
        return container

    def provide_metrics() -> Metrics:
        return metrics

    return Litestar(
        route_handlers=[
            HealthController,
            OpenAIController,
            ResponsesController,
            AnthropicController,
            MetricsController,
        ],
        dependencies={
            "container": Provide(provide_container, sync_to_thread=False),
            "metrics": Provide(provide_metrics, sync_to_thread=False),
        },
        guards=[api_key_guard(settings.api_key)] if settings.api_key else [],
        middleware=[RequestMetrics(metrics)],
        before_send=[count_unmatched(metrics)],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_request_body_bytes,
        openapi_config=OpenAPIConfig(
            title="omlx",
            version=__version__,
            path="/schema",
            description="OpenAI- and Anthropic-compatible inference on MLX with a persistent prefix cache.",
        ),
        on_shutdown=[container.close],
        debug=False,
    )
