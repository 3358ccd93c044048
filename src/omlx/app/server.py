"""Run the HTTP server: bootstrap, then uvicorn on the Litestar app."""

from __future__ import annotations

import logging

from omlx.app.settings import Settings

log = logging.getLogger(__name__)


def run_server(settings: Settings) -> None:
    import uvicorn

    from omlx.app.api.app import create_app
    from omlx.app.bootstrap import bootstrap

    container = bootstrap(settings, load_in_background=True)
    app = create_app(container)
    log.info("serving %s on http://%s:%d", ", ".join(container.pool.specs), settings.host, settings.port)
    try:
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=5,
        )
    finally:
        container.close()
