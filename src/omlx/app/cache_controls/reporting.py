"""A request's cache report, made from its restore before its response starts.

The engine says what it restored when the request leaves the queue (``PrefillStarted``):
the report is made from that, so ``x-omlx-cache`` says what usage does whatever happened
in between (a wait for another request's prefill, blocks read from disk part-way, a
hybrid's restore point, a kept cache). A response's headers go out with its first bytes
(``api.sse.EventStream`` holds a stream's until then), so keepalives are held back until
the report is known, for ``REPORT_HOLD_S`` at most: a request queued longer starts its
response first and its header says the report is pending (the request log and
``/v1/cache/recent`` get it once it is known).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import anyio

from omlx.app.cache_controls.report import CacheReport
from omlx.domain.generation import GenerationEvent, PrefillStarted

# The longest a stream's first bytes wait for its report: under the read timeouts proxies
# commonly keep (30-60 s), above most queue waits and shared-prefill waits.
REPORT_HOLD_S = 20.0

MakeReport = Callable[[PrefillStarted], CacheReport | None]  # blocks: run off the loop
Noted = Callable[[CacheReport], None]


async def reported(
    events: AsyncIterator[GenerationEvent | None],
    make: MakeReport,
    noted: Noted,
    hold_s: float = REPORT_HOLD_S,
) -> AsyncGenerator[GenerationEvent | None, None]:
    """``events`` as they come, the report made (``make``, off the loop) and handed to
    ``noted`` before ``PrefillStarted`` goes on; keepalives (None) before it are dropped
    for ``hold_s`` seconds. Closing this closes ``events`` (the request is cancelled)."""
    since = time.monotonic()
    known = False
    try:
        async for event in events:
            if event is None and not known and time.monotonic() - since < hold_s:
                continue  # the response's start waits for its report
            if isinstance(event, PrefillStarted) and not known:
                known = True
                made = await anyio.to_thread.run_sync(make, event)
                if made is not None:
                    noted(made)
            yield event
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):  # a client that left: cancel it now
                await aclose()
