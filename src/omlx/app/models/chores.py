"""A loaded model's start-up chores, run on a thread while it serves nothing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from omlx.app.models.pool import Served

log = logging.getLogger(__name__)

# A loaded model's chores (see run_when_quiet) run after this long without a request,
# or at the latest this long after its load.
_QUIET_BEFORE_CHORES_S = 2.0
_CHORES_AT_LATEST_S = 600.0


def run_when_quiet(served: Served, jobs: list[Callable[[Callable[[], bool]], Any]]) -> None:
    """Run a loaded model's start-up chores on a thread, while it serves nothing.

    The chores hold the CPU (and the GIL) for seconds: the grammar tokenizer's build
    (0.6-0.7 s), the prepared copy's write (1.7-2.9 s for the default model; beside the
    first request it made that request's first token 1.0-1.5 s late, beside a cold turn
    that turn 1-2 s slower). Agents leave gaps between turns, and neither is needed at
    once: a constrained request builds the grammar view itself, and the copy matters at
    the next start. So they start after ``_QUIET_BEFORE_CHORES_S`` without a request, and
    each job gets ``proceed``, which it calls between its steps: it returns at once while
    the model is idle, waits for another quiet spell while it is busy, and is False once
    the model is unloaded (the job then stops; a write leaves nothing). After
    ``_CHORES_AT_LATEST_S`` it no longer waits. An unload stops the thread and waits for
    it, so the weights a write reads leave with the model.
    """
    stop = threading.Event()
    deadline = time.monotonic() + _CHORES_AT_LATEST_S

    def quiet_spell() -> bool:
        quiet_since = time.monotonic()
        while True:
            now = time.monotonic()
            if served.busy(now):
                quiet_since = now
            elif now - quiet_since >= _QUIET_BEFORE_CHORES_S or now > deadline:
                return True
            if stop.wait(0.25):
                return False  # unloaded first: a later load does the chores

    def proceed() -> bool:
        if stop.is_set():
            return False
        return not served.busy(time.monotonic()) or time.monotonic() > deadline or quiet_spell()

    def run() -> None:
        if not quiet_spell():
            return
        for job in jobs:
            if not proceed():
                return
            try:
                job(proceed)
            except Exception:  # chores are optimisations: the model serves without them
                log.warning("a start-up chore of %s failed", served.id, exc_info=True)

    thread = threading.Thread(target=run, name="omlx-chores", daemon=True)

    def stop_chores() -> None:
        stop.set()
        thread.join()

    served.closers.append(stop_chores)  # the last closer added runs first
    thread.start()
