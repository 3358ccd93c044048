"""Hit rate, cached share and TTFT over time, per model: a bounded series the server samples.

Every ``interval`` seconds the sampler folds the requests that finished since its last
sample into one point per model that served any; a model with no requests in a spell
gets no point there (the chart's line skips it). Each model keeps the newest
``max_points`` points.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from omlx.app.ops.request_log import RequestLog, RequestRecord

DEFAULT_MAX_POINTS = 720  # an hour at the default 5-second interval


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    at: float  # wall time of the sample
    requests: int
    # Share of the requests that restored more than their chat template's fixed preamble
    # (every request restores that much: counting it, every request would be a hit).
    hit_rate: float
    cached_share: float  # cached prompt tokens / prompt tokens
    ttft_ms: float | None  # median time to first token; None: no request produced a token


class RequestSeries:
    """Per-model points from a ``RequestLog``; ``sample()`` takes one, ``run()`` keeps taking them."""

    def __init__(
        self,
        log: RequestLog,
        interval: float,
        max_points: int = DEFAULT_MAX_POINTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.log = log
        self.interval = interval
        self.max_points = max_points
        self._clock = clock
        self._seen = log.last_seq
        self._points: dict[str, deque[SeriesPoint]] = {}
        # The same, per tenant: a tenant's charts are drawn from its own requests alone.
        self._tenant_points: dict[tuple[str, str], deque[SeriesPoint]] = {}

    def sample(self) -> dict[str, SeriesPoint]:
        """Fold the requests finished since the last sample into one point per model."""
        fresh = self.log.after(self._seen)
        if fresh:
            self._seen = fresh[-1].seq
        by_model: dict[str, list[RequestRecord]] = {}
        by_tenant: dict[tuple[str, str], list[RequestRecord]] = {}
        for record in fresh:
            by_model.setdefault(record.model, []).append(record)
            by_tenant.setdefault((record.tenant, record.model), []).append(record)
        now = self._clock()
        taken = {model: _point(now, records) for model, records in by_model.items()}
        for model, point in taken.items():
            self._points.setdefault(model, deque(maxlen=self.max_points)).append(point)
        for key, records in by_tenant.items():
            points = self._tenant_points.setdefault(key, deque(maxlen=self.max_points))
            points.append(_point(now, records))
        return taken

    def points(self, tenant: str | None = None) -> dict[str, list[SeriesPoint]]:
        """Every request's points per model; ``tenant``'s own alone when given ("": default)."""
        if tenant is None:
            return {model: list(points) for model, points in self._points.items()}
        return {m: list(p) for (t, m), p in self._tenant_points.items() if t == tenant}

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled (an app background task)."""
        while True:
            await asyncio.sleep(self.interval)
            self.sample()


def _point(now: float, records: list[RequestRecord]) -> SeriesPoint:
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    return SeriesPoint(
        at=now,
        requests=len(records),
        hit_rate=sum(1 for r in records if r.hit) / len(records),
        cached_share=cached / prompt if prompt else 0.0,
        ttft_ms=statistics.median(ttfts) * 1000 if ttfts else None,
    )
