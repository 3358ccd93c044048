"""The server's stop, told to what serves requests (``stopping_server`` requests it).

The first SIGINT or SIGTERM requests it once: every generation running ends with
``ServerStopping`` (a stream's last event; a 503 for an answer not yet sent), requests
waiting for a model load are refused, and no new generation or load starts. Listeners are
called on the event loop's thread, where everything here runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from omlx.app.errors import ServerStopping

T = TypeVar("T")


class StopSignal:
    def __init__(self) -> None:
        self.requested = False
        self._listeners: dict[int, Callable[[], None]] = {}
        self._next = 0

    def request(self) -> bool:
        """Begin the stop: tell every listener, once. False when it had begun already."""
        if self.requested:
            return False
        self.requested = True
        for listener in list(self._listeners.values()):
            listener()
        return True

    def check(self) -> None:
        """Refuse new work once the stop has begun (a 503)."""
        if self.requested:
            raise ServerStopping()

    @property
    def listening_count(self) -> int:
        """How many listeners there are now (running generations, waits for a load...)."""
        return len(self._listeners)

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` when the stop begins (at once if it has); returns what
        unsubscribes it."""
        key = self._next
        self._next += 1
        self._listeners[key] = listener
        if self.requested:
            listener()
        return lambda: self._listeners.pop(key, None)

    @contextmanager
    def listening(self, listener: Callable[[], None]) -> Iterator[None]:
        """Call ``listener`` when the stop begins (at once if it has) while inside."""
        unsubscribe = self.subscribe(listener)
        try:
            yield
        finally:
            unsubscribe()

    async def unless_stopping(self, work: Awaitable[T]) -> T:
        """Await ``work``; if the stop begins first, cancel it and raise ``ServerStopping``."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not stopped.done():
                stopped.set_result(None)

        with self.listening(wake):
            try:
                await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                task.cancel()
                raise
        if not task.done():
            task.cancel()
            raise ServerStopping()
        return task.result()
