"""Warm restart: a model's hot set recorded while it serves and read back when it starts.

One thread per model cache: first the prefetch of the hot set the last run recorded
(``Prefetch``), then a record every ``record_every`` seconds when the hot tier changed,
and one more at ``close`` (a clean shutdown). So a crash keeps a list at most that old.
Recording starts only once the prefetch ended: a list written halfway through it would
drop the conversations not read back yet. Then ``prime`` is handed the chain of the
conversation used last (``prime.latest_conversation``): the wiring has the engine join it
into a kept cache when idle, so its next turn continues it as on a running server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from omlx.domain.cache.hot_set import HotSet, hot_set_order
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.ports import ColdSource, HotSetStore
from omlx.domain.cache.prefetch import RUNNING, Prefetch, PrefetchProgress
from omlx.domain.cache.prime import latest_conversation

log = logging.getLogger(__name__)

RECORD_EVERY_S = 60.0


class WarmRestart:
    """Records ``hot``'s hot set to ``store`` and, at ``start``, prefetches the last one."""

    def __init__(
        self,
        *,
        namespace: str,
        hot: HotTier,
        cold: ColdSource,
        store: HotSetStore,
        nbytes: Callable[[Any], int],
        busy: Callable[[], bool] = lambda: False,
        prime: Callable[[Sequence[str]], None] | None = None,
        record_every: float = RECORD_EVERY_S,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.namespace = namespace
        self._hot, self._cold, self._store = hot, cold, store
        self._nbytes, self._busy, self._prime = nbytes, busy, prime
        self._record_every = record_every
        self._wall_clock = wall_clock
        self._stop = threading.Event()
        self._priming = threading.Event()  # set while ``prime`` runs
        self._thread: threading.Thread | None = None
        self._prefetch: Prefetch | None = None
        self._recorded_version: int | None = None
        self._record_lock = threading.Lock()  # the periodic record and close's never overlap
        self.records = 0

    def start(self) -> WarmRestart:
        self._recorded_version = self._hot.version  # nothing used yet: nothing to record
        self._thread = threading.Thread(
            target=self._run, name=f"omlx-warm-restart-{self.namespace[:8]}", daemon=True
        )
        self._thread.start()
        return self

    def progress(self) -> PrefetchProgress:
        """The prefetch's progress (running until the saved hot set is loaded and the
        latest conversation primed or dropped)."""
        prefetch = self._prefetch
        if prefetch is None:
            return PrefetchProgress(RUNNING)
        p = prefetch.progress()
        return replace(p, state=RUNNING) if self._priming.is_set() else p

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the prefetch to end (tests); whether it did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.progress().state == RUNNING:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def record(self, *, force: bool = False) -> bool:
        """Save the hot set if the hot tier changed since the last save (any thread)."""
        with self._record_lock:
            version = self._hot.version
            if not force and version == self._recorded_version:
                return False
            prefetch = self._prefetch
            carried = prefetch.remaining() if prefetch is not None else ()
            entries = hot_set_order(self._hot.recent(), self._hot.max_bytes, carried)
            hot_set = HotSet(self.namespace, self._wall_clock(), entries)
            try:
                self._store.save(hot_set)
            except OSError as exc:  # a full or read-only disk: the next record tries again
                log.warning("warm restart: recording the hot set failed: %s", exc)
                return False
            self._recorded_version = version
            self.records += 1
            return True

    def close(self) -> None:
        """Stop the prefetch and the periodic records, then record once more (shutdown)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.record()

    def _run(self) -> None:
        try:
            self._prefetch_saved()
        except Exception:  # never fail a start: the cache works without it
            log.exception("warm restart: the prefetch failed")
        while not self._stop.wait(self._record_every):
            try:
                self.record()
            except Exception:
                log.exception("warm restart: recording the hot set failed")

    def _prefetch_saved(self) -> None:
        saved = self._store.load()
        if saved is None or saved.namespace != self.namespace:
            saved = HotSet(self.namespace, 0.0, ())
        prefetch = Prefetch(
            saved, hot=self._hot, cold=self._cold, nbytes=self._nbytes, busy=self._busy
        )
        latest = latest_conversation(saved.entries)
        primes = self._prime is not None and bool(latest)
        if primes:
            self._priming.set()  # before the prefetch can say done: /health waits for both
        self._prefetch = prefetch
        try:
            done = prefetch.run(self._stop)
            if primes and not self._stop.is_set():
                self._prime([e.key for e in latest])  # type: ignore[misc]
        finally:
            self._priming.clear()
        if saved.entries:
            log.info(
                "warm restart: %d of %d blocks (%d of %d bytes) read back into RAM in %.2f s; "
                "%d already there, %d skipped (missing or damaged on disk)%s",
                done.blocks,
                done.planned_blocks,
                done.bytes,
                done.planned_bytes,
                done.seconds,
                done.held,
                done.skipped,
                f"; ended early: {done.ended}" if done.ended else "",
            )
