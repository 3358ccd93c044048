"""What a starting server is waiting for, named as it happens (``/health``'s ``waiting_for``).

Any thread marks the start and end of a step (``with STARTUP.step("loading X: reading
weights"):``); ``waiting_for()`` lists the steps under way, oldest first, each with its
seconds so far. Process-wide, because the steps run on several threads and in layers that
must not know one another (the HTTP port answers before the app that owns the models is
even imported).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StartupSteps:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._steps: dict[int, tuple[str, float]] = {}
        self._next = 0

    def begin(self, name: str) -> int:
        """Mark a step begun; ``end`` it with the number this returns."""
        with self._lock:
            key = self._next
            self._next += 1
            self._steps[key] = (name, self._clock())
            return key

    def end(self, key: int) -> None:
        with self._lock:
            self._steps.pop(key, None)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        key = self.begin(name)
        try:
            yield
        finally:
            self.end(key)

    def waiting_for(self) -> list[str]:
        now = self._clock()
        with self._lock:
            steps = sorted(self._steps.items())
        return [f"{name} ({now - started:.1f} s)" for _, (name, started) in steps]


STARTUP = StartupSteps()
