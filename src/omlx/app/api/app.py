"""``create_app(container) -> Litestar``: routes, error envelopes, the container as a dependency."""

from __future__ import annotations

from litestar import Litestar
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from omlx import __version__
from omlx.app.api.errors import EXCEPTION_HANDLERS
from omlx.app.api.health import HealthController
from omlx.app.api.openai import OpenAIController
from omlx.app.container import Container


def create_app(container: Container) -> Litestar:
    def provide_container() -> Container:
        return container

    return Litestar(
        route_handlers=[HealthController, OpenAIController],
        dependencies={"container": Provide(provide_container, sync_to_thread=False)},
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=container.settings.max_request_body_bytes,
        openapi_config=OpenAPIConfig(title="omlx", version=__version__, path="/schema"),
        on_shutdown=[container.close],
        debug=False,
    )
