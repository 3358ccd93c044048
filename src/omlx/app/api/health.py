"""Liveness and state: answers without touching the engine thread."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get

from omlx.app.api.auth import PUBLIC
from omlx.app.wiring.container import Container


class HealthController(Controller):
    path = "/health"
    tags = ("health",)

    @get(
        operation_id="health",
        summary="Server, engine and cache state (no API key needed)",
        opt={PUBLIC: True},
    )
    async def health(self, container: Container) -> dict[str, Any]:
        return container.health()
