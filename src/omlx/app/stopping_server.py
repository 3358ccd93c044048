"""uvicorn's server, stopped the omlx way on SIGINT and SIGTERM.

Left to itself, uvicorn lets running streams go on for ``timeout_graceful_shutdown``
seconds, then cancels them (a traceback each, the client's stream cut with no error event),
and raises the signal again once it has shut down (click's "Aborted!" and exit status 1 on
SIGINT, death by SIGTERM). Here the first signal closes the port at once (new connections
are refused: a proxy or a retrying client goes elsewhere without having sent anything) and
requests the app's ``StopSignal``: running streams end with their error event and their
terminator, keeping what they prefilled, and requests already received get a 503. uvicorn's
shutdown then runs the app's: loads in flight end, then engines, the writer's drain and
the hot set's record. The process exits 0. A second signal quits at once: the cache stays
consistent (a block is indexed only once its file is on disk), what was queued is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterator

import uvicorn

from omlx.app.stop_signal import StopSignal

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StoppingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, stop: StopSignal) -> None:
        super().__init__(config)
        self.stop = stop

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The signals, on the event loop (uvicorn's own capture re-raises them at the end)."""
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.on_signal, sig)
        try:
            yield
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    def on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.stop.requested:
            log.warning(
                "%s again: quitting now; blocks not yet on disk are lost, the cache stays "
                "consistent",
                name,
            )
            logging.shutdown()
            os._exit(128 + sig)
        log.info(
            "%s: stopping; the port is closed, running generations end now and keep what "
            "they prefilled (%s again quits at once)",
            name,
            name,
        )
        for server in getattr(self, "servers", ()):  # none yet while uvicorn starts
            server.close()  # refused from now on, not from uvicorn's next tick
        self.stop.request()
        self.should_exit = True
