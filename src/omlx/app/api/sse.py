"""Server-sent events for both APIs' streams."""

from __future__ import annotations

from typing import Any

from litestar.response import ServerSentEvent
from litestar.response.base import ASGIResponse
from litestar.response.sse import ServerSentEventMessage

KEEPALIVE = ServerSentEventMessage(data=None, comment="keepalive")
KEEPALIVE_SECONDS = 5.0  # quiet seconds (a long prefill) before a keepalive goes out


class EventStream(ServerSentEvent):
    """An SSE response that keeps ``text/event-stream`` when returned from a JSON-typed handler.

    Litestar lets the handler's media type (JSON, from its return annotation)
    override a returned stream's own; the OpenAPI documents both bodies.
    """

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        kwargs["media_type"] = self.media_type
        return super().to_asgi_response(*args, **kwargs)
