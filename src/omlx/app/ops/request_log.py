"""The last finished requests, in a bounded ring: what the dashboard lists and charts.

Each generation that ends with ``Finished`` is recorded where the generation service
sees it end (``GenerationService.finished_hook``); the API family it came through is
read from ``current_api``, which the dashboard's middleware sets per HTTP request, and
where a missed prompt left the cache from the slot ``current_report`` that the same
middleware opens and ``cache_edge.note`` fills with the request's cache report.
Requests whose client left before the end are not recorded (there is no ``Finished``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from omlx.app.cache_controls.report import CacheReport
from omlx.domain.generation import Finished
from omlx.domain.json_values import JsonObject

DEFAULT_CAPACITY = 200

# The API family and route of the HTTP request being served ("openai", "/v1/chat/completions");
# empty off HTTP.
current_api: ContextVar[tuple[str, str]] = ContextVar("omlx_current_api", default=("", ""))
# A per-request slot ({"report": CacheReport, "tenant": str, "session": str}) the middleware
# opens: a mutable holder, so what the handler notes is seen where the generation ends,
# whichever task that is.
current_report: ContextVar[JsonObject | None] = ContextVar("omlx_current_report", default=None)


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a missed prompt left the cache, from its ``CacheReport``."""

    at: int  # the prompt token where the prompt leaves what the cache holds
    message: int | None  # the rendered conversation's message it falls in (None: a raw prompt)
    role: str | None
    part: str | None  # "system", "tools", "messages[k]"
    prompt: str  # the prompt from there on (an excerpt)
    cached: str  # what the cache holds there instead ("": the cache ends)

    @classmethod
    def of(cls, report: CacheReport | None) -> Divergence | None:
        if report is None or report.full_hit:
            return None
        r = report
        at = r.diverged_at if r.diverged_at is not None else r.cached
        return cls(at, r.message, r.role, r.part, r.prompt_next, r.cached_next)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished generation, as the dashboard shows it."""

    seq: int  # 1, 2, ... in finishing order: a reader asks for what came after its last
    at: float  # wall time it finished (time.time())
    model: str
    api: str  # the API family: openai, anthropic, ...
    route: str  # the route it came through: /v1/chat/completions, /v1/messages, ...
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    tier: str  # hot, ssd, none
    reason: str  # stop, length
    ttft_s: float | None  # None: no token came
    tokens_per_s: float | None  # decode rate after the first token; None: too few tokens
    divergence: Divergence | None = None  # None: a full hit, or no cache report (no prefix cache)
    tenant: str = ""  # the key's tenant ("": the default one)
    session: str = ""  # the session the request named (``session_key``; "": none)
    outcome: str = ""  # its cache report's (``cache_controls.outcome``; "": no report)
    preamble_tokens: int = 0  # its prompt's leading tokens that are the template's preamble

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def hit(self) -> bool:
        """It restored more than its template's fixed preamble (which every request does)."""
        return self.cached_tokens > self.preamble_tokens


class RequestLog:
    """A thread-safe ring of the last ``capacity`` finished requests."""

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.time
    ) -> None:
        if capacity < 1:
            raise ValueError("a request log holds at least one request")
        self._ring: deque[RequestRecord] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._seq = 0
        self._clock = clock

    def record(
        self, model: str, event: Finished, ttft_s: float | None, decode_s: float
    ) -> RequestRecord:
        """Keep one finished generation; ``decode_s``: first token to the end."""
        decoded = event.completion_tokens - 1  # the first token's time is the TTFT's
        rate = decoded / decode_s if decoded > 0 and decode_s > 0 else None
        api, route = current_api.get()
        slot = current_report.get() or {}
        report: CacheReport | None = slot.get("report")
        divergence = Divergence.of(report)
        with self._lock:
            self._seq += 1
            record = RequestRecord(
                seq=self._seq,
                at=self._clock(),
                model=model,
                api=api or "internal",
                route=route,
                prompt_tokens=event.prompt_tokens,
                cached_tokens=event.cached_tokens,
                completion_tokens=event.completion_tokens,
                tier=event.tier,
                reason=event.reason,
                ttft_s=ttft_s,
                tokens_per_s=rate,
                divergence=divergence,
                tenant=slot.get("tenant") or "",
                session=slot.get("session") or "",
                outcome=report.outcome if report is not None else "",
                preamble_tokens=report.preamble if report is not None else 0,
            )
            self._ring.append(record)
        return record

    def recent(self, limit: int | None = None, tenant: str | None = None) -> list[RequestRecord]:
        """The newest ``limit`` records (all held when None; ``tenant``'s alone when given),
        newest first."""
        with self._lock:
            records = [r for r in self._ring if tenant is None or r.tenant == tenant]
        records.reverse()
        return records if limit is None else records[:limit]

    def after(self, seq: int) -> list[RequestRecord]:
        """Records newer than ``seq``, oldest first (a sampler's new work since its last look)."""
        with self._lock:
            return [r for r in self._ring if r.seq > seq]

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._seq

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0
