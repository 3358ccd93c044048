"""Server-sent events for both APIs' streams."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from litestar.response import ServerSentEvent
from litestar.response.base import ASGIResponse
from litestar.response.sse import ServerSentEventMessage

from omlx.app.api.disconnect import unless_disconnected

T = TypeVar("T")

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


async def opened(
    events: AsyncGenerator[T, None], receive: Callable[[], Awaitable[dict]]
) -> AsyncGenerator[T, None]:
    """``events`` with its first item already awaited (the client watched meanwhile: one
    that leaves cancels it), for a stream whose response must start after it.

    A handler returns the stream once this returns, so the response's headers go out after
    the first event: a chat turn's first event comes once its cache report is made
    (``cache_controls.reporting``), which the ``x-omlx-cache`` header then carries. An error
    before it (a stopping server) is the handler's, an HTTP error rather than an event.
    """
    try:
        first = await unless_disconnected(receive, anext(events))
    except StopAsyncIteration:
        return _nothing()
    return _after(first, events)


async def _after(first: T, events: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    try:
        yield first
        async for event in events:
            yield event
    finally:
        await events.aclose()


async def _nothing() -> AsyncGenerator[T, None]:
    return
    yield
