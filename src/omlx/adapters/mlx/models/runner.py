"""One thread that runs a model's MLX work in order (embedding and rerank models).

Chat models have their engine thread; models that answer in one forward pass per input
get this simpler one: callables in, futures out, each on the runner's own thread and
stream, so no MLX array is touched from the event loop (STYLE §6).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import mlx.core as mx

log = logging.getLogger(__name__)
T = TypeVar("T")


class MLXRunner:
    def __init__(self, name: str) -> None:
        self.name = name
        self._inbox: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=f"omlx-{name}", daemon=True)
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self.last_submitted = 0.0  # time.monotonic() of the latest submit (read by the pool)

    @property
    def active(self) -> int:
        """Calls running now, 0 or 1 (the pool never unloads a busy model)."""
        with self._lock:
            return self._running

    @property
    def queued(self) -> int:
        """Calls waiting behind the running one."""
        with self._lock:
            return self._waiting

    def start(self) -> MLXRunner:
        self._thread.start()
        return self

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._waiting += 1
            self.last_submitted = time.monotonic()
        self._inbox.put((fn, future))
        return future

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        stream = mx.new_stream(mx.default_device())
        while True:
            item = self._inbox.get()
            if item is None:
                return
            fn, future = item
            with self._lock:
                self._waiting -= 1
                self._running += 1
            try:
                if future.set_running_or_notify_cancel():
                    with mx.stream(stream):
                        future.set_result(fn())
            except BaseException as exc:  # the caller gets it through the future
                future.set_exception(exc)
            finally:
                with self._lock:
                    self._running -= 1
