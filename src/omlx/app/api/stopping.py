"""Requests that reach the app once the server is stopping get a 503, in their API's envelope.

The port closes when the stop begins (``stopping_server.StoppingServer``), so these are the few
that came on a connection already open, or just before it closed.
"""

from __future__ import annotations

from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Receive, Scope, Send

from omlx.app.stop_signal import StopSignal


class RefuseWhileStopping(ASGIMiddleware):
    def __init__(self, stop: StopSignal) -> None:
        self.stop = stop

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        if scope["type"] == "http":
            self.stop.check()  # ServerStopping: the route's error handler answers it
        await next_app(scope, receive, send)
