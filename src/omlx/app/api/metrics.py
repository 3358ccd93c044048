"""``GET /metrics``: Prometheus text from a per-app registry.

Request and generation metrics are recorded as they happen; engine and cache
numbers are read from their ``stats()`` at scrape time by a custom collector,
so the engine thread and the cache tiers carry no Prometheus code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omlx.app.container import Container
from omlx.app.pool import Served
from omlx.domain.generation import Finished

UNMATCHED = "unmatched"  # the route label of 404/405 answers, whatever the path
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
_PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60)
_ACCEPTANCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Metrics:
    """One app's metrics; also the generation service's observer (TTFT, tokens)."""

    def __init__(self, container: Container) -> None:
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
            "changed: system, tools, messages (input, for the Responses API), model, or not_cached "
            "(the blocks were gone)",
            ["part"],
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
        r.register(StateCollector(container))

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
        summary="Prometheus metrics (text exposition format)",
        media_type=CONTENT_TYPE_LATEST,
    )
    async def metrics(self, metrics: Metrics) -> Response[bytes]:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


class StateCollector(Collector):
    """Engine queue depths and cache-tier counters, read at scrape time."""

    def __init__(self, container: Container) -> None:
        self.container = container

    def collect(self) -> Iterator[Metric]:
        c = self.container
        loaded = c.pool.loaded()
        active = GaugeMetricFamily(
            "omlx_engine_active_requests", "Requests in a model's running batch", labels=["model"]
        )
        queued = GaugeMetricFamily(
            "omlx_engine_queued_requests", "Requests waiting for a batch slot", labels=["model"]
        )
        memory = GaugeMetricFamily(
            "omlx_model_memory_bytes",
            "What a loaded model holds against max_model_memory: its weights, its KV",
            labels=["model", "kind"],
        )
        for served in loaded:
            active.add_metric([served.id], served.engine.active)
            queued.add_metric([served.id], served.engine.queued)
        for model, held in c.pool.account.snapshot().items():
            memory.add_metric([model, "weights"], held["weights"])
            memory.add_metric([model, "kv"], held["kv"])
        yield active
        yield queued
        yield memory
        yield GaugeMetricFamily("omlx_models_loaded", "Models loaded now", value=len(loaded))
        yield CounterMetricFamily(
            "omlx_model_loads", "Models loaded since start", value=c.pool.loads
        )
        normalized = CounterMetricFamily(
            "omlx_prompt_normalizations",
            "System text blocks a prompt normalization rewrote or removed, by rule",
            labels=["rule"],
        )
        for rule, count in c.normalizer.applied().items():
            normalized.add_metric([rule], count)
        yield normalized
        yield from _cache_families(c, [s for s in loaded if s.prefix_cache is not None])


_FAMILIES = {
    "omlx_cache_lookups": (CounterMetricFamily, "Prefix-cache lookups", ()),
    "omlx_cache_lookup_tokens": (
        CounterMetricFamily,
        "Prompt tokens looked up in the prefix cache",
        (),
    ),
    "omlx_cache_hit_tokens": (CounterMetricFamily, "Prompt tokens found in the prefix cache", ()),
    "omlx_cache_block_hits": (
        CounterMetricFamily,
        "Blocks a lookup matched, by the tier that held them",
        ("tier",),
    ),
    "omlx_cache_blocks_read": (CounterMetricFamily, "Blocks read back from a tier", ("tier",)),
    "omlx_cache_blocks_queued": (
        CounterMetricFamily,
        "Blocks handed to a tier's writer",
        ("tier",),
    ),
    "omlx_cache_blocks_written": (CounterMetricFamily, "Blocks stored in a tier", ("tier",)),
    "omlx_cache_bytes_written": (
        CounterMetricFamily,
        "Bytes of blocks written to a tier",
        ("tier",),
    ),
    "omlx_cache_blocks_evicted": (
        CounterMetricFamily,
        "Blocks evicted from a tier to stay in budget",
        ("tier",),
    ),
    "omlx_cache_bytes_evicted": (
        CounterMetricFamily,
        "Bytes of blocks evicted from a tier",
        ("tier",),
    ),
    "omlx_cache_blocks_dropped": (
        CounterMetricFamily,
        "Blocks not written, by reason",
        ("tier", "reason"),
    ),
    "omlx_cache_blocks_rejected": (
        CounterMetricFamily,
        "Stored blocks refused on read, by reason",
        ("tier", "reason"),
    ),
    "omlx_cache_blocks": (GaugeMetricFamily, "Blocks held in a tier", ("tier",)),
    "omlx_cache_bytes": (GaugeMetricFamily, "Bytes held in a tier", ("tier",)),
    "omlx_cache_max_bytes": (GaugeMetricFamily, "Byte budget of a tier", ("tier",)),
    "omlx_cache_write_queue_blocks": (
        GaugeMetricFamily,
        "Blocks queued for the SSD tier, not yet on disk",
        (),
    ),
    "omlx_cache_pinned_requests": (GaugeMetricFamily, "Requests holding cached blocks pinned", ()),
    "omlx_cache_restore_objects_stored": (
        CounterMetricFamily,
        "Restore-point objects kept for hybrid and sliding-window models (state snapshots, window KV)",
        (),
    ),
    "omlx_cache_restore_object_bytes": (
        CounterMetricFamily,
        "Bytes of the restore-point objects kept",
        (),
    ),
    "omlx_cache_store_seconds": (
        CounterMetricFamily,
        "Engine-thread time spent keeping blocks (cutting, encoding, queueing) as requests run",
        (),
    ),
    "omlx_cache_lost_tokens": (
        CounterMetricFamily,
        "Prompt tokens the KV chain matched past the deepest restore point, so recomputed",
        (),
    ),
}


def _cache_families(c: Container, served: list[Served]) -> Iterator[Metric]:
    """Each loaded model's tiers under its ``model`` label; the shared writer's as ``all``."""
    families = {
        name: kind(name, doc, labels=["model", *labels])
        for name, (kind, doc, labels) in _FAMILIES.items()
    }

    def put(name: str, value: Any, *labels: str) -> None:
        if isinstance(value, int | float):
            families[name].add_metric(list(labels), value)

    for one in served:
        m, s = one.id, one.prefix_cache.stats()
        put("omlx_cache_lookups", s.lookups, m)
        put("omlx_cache_lookup_tokens", s.lookup_tokens, m)
        put("omlx_cache_hit_tokens", s.hit_tokens, m)
        put("omlx_cache_block_hits", s.hot_hits, m, "hot")
        put("omlx_cache_block_hits", s.cold_hits, m, "ssd")
        put("omlx_cache_blocks_written", s.stored_blocks, m, "hot")
        put("omlx_cache_pinned_requests", s.active_leases, m)
        put("omlx_cache_restore_objects_stored", s.stored_objects, m)
        put("omlx_cache_restore_object_bytes", s.object_bytes, m)
        put("omlx_cache_lost_tokens", s.lost_tokens, m)
        put("omlx_cache_store_seconds", s.store_seconds, m)
        put("omlx_cache_blocks_queued", s.queued_blocks, m, "ssd")
        hot = s.hot
        put("omlx_cache_blocks_read", hot.hits, m, "hot")
        put("omlx_cache_blocks_evicted", hot.evictions, m, "hot")
        put("omlx_cache_blocks", hot.blocks, m, "hot")
        put("omlx_cache_bytes", hot.bytes, m, "hot")
        put("omlx_cache_max_bytes", hot.max_bytes, m, "hot")
        if one.cold_tier is not None:
            cold = one.cold_tier.stats()
            put("omlx_cache_blocks_read", cold.hits, m, "ssd")
            put("omlx_cache_blocks_dropped", cold.dropped, m, "ssd", "rejected")
            put("omlx_cache_blocks_rejected", cold.corrupt_blocks, m, "ssd", "corrupt")
            put("omlx_cache_blocks_rejected", cold.missing_files, m, "ssd", "missing_file")
    if c.writer is not None:
        w = c.writer.stats()
        put("omlx_cache_blocks_written", w.written, "all", "ssd")
        put("omlx_cache_bytes_written", w.written_bytes, "all", "ssd")
        put("omlx_cache_blocks_evicted", w.evicted_blocks, "all", "ssd")
        put("omlx_cache_bytes_evicted", w.evicted_bytes, "all", "ssd")
        for reason, dropped in (
            ("queue_full", w.dropped_queue_full),
            ("no_space", w.dropped_no_space),
            ("read_only", w.dropped_read_only),
            ("io_error", w.dropped_io_error),
            ("damaged", w.dropped_damaged),
            ("closed", w.dropped_closed),
            ("error", w.dropped_error),
        ):
            put("omlx_cache_blocks_dropped", dropped, "all", "ssd", reason)
        put("omlx_cache_write_queue_blocks", w.queued, "all")
    yield from (f for f in families.values() if f.samples)
