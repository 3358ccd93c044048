"""``GET /metrics``: Prometheus text from a per-app registry.

Request and generation metrics are recorded as they happen; engine and cache
numbers are read from their ``stats()`` at scrape time by a custom collector,
so the engine thread and the cache tiers carry no Prometheus code.
"""

from __future__ import annotations

import time

from litestar import Controller, Response, get
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from omlx.app.api.auth import OPERATOR
from omlx.app.api.state_metrics import StateCollector
from omlx.app.ops.status import ServerStatus
from omlx.domain.generation import Finished

UNMATCHED = "unmatched"  # the route label of 404/405 answers, whatever the path
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
_PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60)
_ACCEPTANCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Metrics:
    """One app's metrics; also the generation service's observer (TTFT, tokens)."""

    def __init__(self, status: ServerStatus) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "omlx_http_requests",
            "HTTP responses by route, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "omlx_http_request_duration_seconds",
            "Request start to last body byte (whole streams), by route",
            ["route"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "omlx_time_to_first_token_seconds",
            "Submission to the first generated text",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.phases = Histogram(
            "omlx_request_phase_seconds",
            "Where time to first token goes, by phase: render (template and tokenizer), "
            "grammar (compiling a structured output's or forced call's grammar), queue, lookup, restore, admit, prefill (the uncached tail), first_step",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "omlx_prompt_tokens", "Prompt tokens of finished generations", registry=r
        )
        self.cached_tokens = Counter(
            "omlx_cached_prompt_tokens",
            "Prompt tokens restored from the prefix cache, not computed",
            registry=r,
        )
        self.generated_tokens = Counter("omlx_generated_tokens", "Tokens generated", registry=r)
        self.generations = Counter(
            "omlx_generations",
            "Generations by how they ended: stop, length, or cancelled (the client left)",
            ["reason"],
            registry=r,
        )
        self.cache_misses = Counter(
            "omlx_cache_misses",
            "Turns that restored less than their conversation's previous prompt allowed, by what "
            "changed: system, tools, messages (input, for the Responses API; or the template "
            "rendering an earlier turn differently), model, or evicted (the blocks were kept, "
            "then evicted)",
            ["part"],
            registry=r,
        )
        self.cache_reports = Counter(
            "omlx_cache_reports",
            "Requests' cache reports (x-omlx-cache), by outcome (hit, extended, changed, evicted, "
            "new_conversation, in_flight, restore_point) and by what they restored: none, "
            "preamble (no more than the chat template's fixed preamble, which every request "
            "restores) or past_preamble (the hit rate's hits)",
            ["outcome", "restored"],
            registry=r,
        )
        self.draft_tokens = Counter(
            "omlx_speculative_draft_tokens",
            "Drafted tokens a verify pass asked the model about, by method (lookup, draft_model)",
            ["method"],
            registry=r,
        )
        self.accepted_tokens = Counter(
            "omlx_speculative_accepted_tokens",
            "Drafted tokens the model agreed with: each one a forward pass saved",
            ["method"],
            registry=r,
        )
        self.verify_steps = Counter(
            "omlx_speculative_steps",
            "Decode steps that verified drafts, by method",
            ["method"],
            registry=r,
        )
        self.acceptance = Histogram(
            "omlx_speculative_acceptance",
            "Per request that drafted: the share of its drafted tokens accepted",
            ["method"],
            buckets=_ACCEPTANCE_BUCKETS,
            registry=r,
        )
        r.register(StateCollector(status))

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def finished(self, event: Finished) -> None:
        self.prompt_tokens.inc(event.prompt_tokens)
        self.cached_tokens.inc(event.cached_tokens)
        self.generated_tokens.inc(event.completion_tokens)
        self.generations.labels(event.reason).inc()
        for phase, seconds in event.phases:
            self.phases.labels(phase).observe(seconds)
        s = event.speculation
        if s is not None and s.drafted:
            self.draft_tokens.labels(s.method).inc(s.drafted)
            self.accepted_tokens.labels(s.method).inc(s.accepted)
            self.verify_steps.labels(s.method).inc(s.steps)
            self.acceptance.labels(s.method).observe(s.accepted / s.drafted)

    def cache_miss(self, part: str) -> None:
        self.cache_misses.labels(part).inc()

    def cache_reported(self, outcome: str, restored: str) -> None:
        self.cache_reports.labels(outcome, restored).inc()

    def cancelled(self) -> None:
        """A client left before the end; the engine drops the request before its next step."""
        self.generations.labels("cancelled").inc()

    def response(self, route: str, method: str, status: int, seconds: float | None) -> None:
        self.requests.labels(route, method, str(status)).inc()
        if seconds is not None:
            self.duration.labels(route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics(ASGIMiddleware):
    """Counts and times each routed request, streams until their last byte or disconnect."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        if scope["type"] != "http":
            await next_app(scope, receive, send)
            return
        start = time.monotonic()
        status = 500  # what the client saw if nothing was sent

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await next_app(scope, receive, send_status)
        finally:
            route = scope.get("path_template") or scope.get("path", UNMATCHED)
            self.metrics.response(route, scope["method"], status, time.monotonic() - start)


def count_unmatched(metrics: Metrics):
    """A ``before_send`` hook: 404/405 answers never reach route middleware, count them here."""

    async def before_send(message: Message, scope: Scope) -> None:
        if message["type"] == "http.response.start" and "route_handler" not in scope:
            metrics.response(UNMATCHED, scope.get("method", ""), message["status"], None)

    return before_send


class MetricsController(Controller):
    path = "/metrics"
    tags = ("metrics",)

    @get(
        operation_id="metrics",
        summary="Prometheus metrics (text exposition format): every tenant's counts, for operators",
        media_type=CONTENT_TYPE_LATEST,
        opt={OPERATOR: True},
    )
    async def metrics(self, metrics: Metrics) -> Response[bytes]:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
