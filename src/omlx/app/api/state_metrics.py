"""The server's state as Prometheus families, read at scrape time from one ``ServerState``
(the numbers ``/health`` and the dashboard show), so the engine thread and the cache tiers
carry no Prometheus code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omlx.app.ops.status import ServerState, ServerStatus
from omlx.domain.cache.blocks import HOT, SSD
from omlx.domain.cache.origins import ORIGINS
from omlx.domain.cache.prefetch import OFF, RUNNING


class StateCollector(Collector):
    """Engine queue depths and cache-tier counters, read at scrape time."""

    def __init__(self, status: ServerStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        state = self.status.read()
        loaded = [m for m in state.models if m.loaded]
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
        for model in loaded:
            active.add_metric([model.id], model.active)
            queued.add_metric([model.id], model.queued)
        for model, held in state.memory_by_model.items():
            memory.add_metric([model, "weights"], held["weights"])
            memory.add_metric([model, "kv"], held["kv"])
        yield active
        yield queued
        yield memory
        yield GaugeMetricFamily("omlx_models_loaded", "Models loaded now", value=len(loaded))
        yield CounterMetricFamily(
            "omlx_model_loads", "Models loaded since start", value=state.loads
        )
        normalized = CounterMetricFamily(
            "omlx_prompt_normalizations",
            "System text blocks a prompt normalization rewrote or removed, by rule",
            labels=["rule"],
        )
        for rule, count in state.normalizations.items():
            normalized.add_metric([rule], count)
        yield normalized
        yield from _cache_families(state)


_FAMILIES = {
    "omlx_cache_lookups": (CounterMetricFamily, "Prefix-cache lookups", ()),
    "omlx_cache_lookup_tokens": (
        CounterMetricFamily,
        "Prompt tokens looked up in the prefix cache",
        (),
    ),
    "omlx_cache_hit_tokens": (
        CounterMetricFamily,
        "Prompt tokens found in the prefix cache, by the tier that held them and who computed "
        "them: origin self (this server), peer (another server on the shared index), unknown",
        ("tier", "origin"),
    ),
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
    "omlx_image_encoder_passes": (
        CounterMetricFamily,
        "Vision encoder passes of a VLM (an image whose rows no tier held)",
        (),
    ),
    "omlx_image_rows_hits": (
        CounterMetricFamily,
        "Images whose rows a tier held, so no encoder pass ran",
        ("tier",),
    ),
    "omlx_image_rows": (GaugeMetricFamily, "Images whose rows RAM holds now", ("tier",)),
    "omlx_image_rows_bytes": (
        GaugeMetricFamily,
        "Bytes of image rows RAM holds now (within the hot tier's budget)",
        ("tier",),
    ),
    "omlx_image_rows_queued": (
        CounterMetricFamily,
        "Images' rows handed to the SSD tier's writer",
        (),
    ),
    "omlx_cache_lost_tokens": (
        CounterMetricFamily,
        "Prompt tokens the KV chain matched past the deepest restore point, so recomputed",
        (),
    ),
    "omlx_warm_restart_running": (
        GaugeMetricFamily,
        "1 while the start's prefetch reads the last run's hot set back into RAM",
        (),
    ),
    "omlx_warm_restart_blocks": (
        GaugeMetricFamily,
        "Blocks of the last run's hot set: planned, read into RAM, already there, or skipped "
        "(missing or damaged on disk)",
        ("what",),
    ),
    "omlx_warm_restart_bytes": (
        GaugeMetricFamily,
        "Bytes of the last run's hot set: planned, or read into RAM",
        ("what",),
    ),
    "omlx_warm_restart_seconds": (
        GaugeMetricFamily,
        "Seconds the start's prefetch has run (its whole time once done)",
        (),
    ),
}


def _cache_families(state: ServerState) -> Iterator[Metric]:
    """Each loaded model's tiers under its ``model`` label; the shared writer's as ``all``."""
    families = {
        name: kind(name, doc, labels=["model", *labels])
        for name, (kind, doc, labels) in _FAMILIES.items()
    }

    def put(name: str, value: Any, *labels: str) -> None:
        if isinstance(value, int | float):
            families[name].add_metric(list(labels), value)

    for model in state.models:
        images = model.images
        if images is not None:
            m = model.id
            put("omlx_image_encoder_passes", images["encoder_passes"], m)
            put("omlx_image_rows_hits", images["ram_hits"], m, "hot")
            put("omlx_image_rows_hits", images["ssd_hits"], m, "ssd")
            put("omlx_image_rows", images["images"], m, "hot")
            put("omlx_image_rows_bytes", images["bytes"], m, "hot")
            put("omlx_image_rows_queued", images["queued_for_ssd"], m)
    for model in state.models:
        if model.cache is None or model.cache.stats is None:
            continue
        m, s = model.id, model.cache.stats
        put("omlx_cache_lookups", s.lookups, m)
        put("omlx_cache_lookup_tokens", s.lookup_tokens, m)
        for tier in (HOT, SSD):
            for origin in ORIGINS:
                put(
                    "omlx_cache_hit_tokens", s.hit_tokens_by.get((tier, origin), 0), m, tier, origin
                )
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
        warm = model.cache.warm_restart
        if warm is not None and warm.state != OFF:
            put("omlx_warm_restart_running", int(warm.state == RUNNING), m)
            put("omlx_warm_restart_blocks", warm.planned_blocks, m, "planned")
            put("omlx_warm_restart_blocks", warm.blocks, m, "read")
            put("omlx_warm_restart_blocks", warm.held, m, "already_in_ram")
            put("omlx_warm_restart_blocks", warm.skipped, m, "skipped")
            put("omlx_warm_restart_bytes", warm.planned_bytes, m, "planned")
            put("omlx_warm_restart_bytes", warm.bytes, m, "read")
            put("omlx_warm_restart_seconds", warm.seconds, m)
        cold = model.cache.cold
        if cold is not None:
            put("omlx_cache_blocks_read", cold.hits, m, "ssd")
            put("omlx_cache_blocks_dropped", cold.dropped, m, "ssd", "rejected")
            put("omlx_cache_blocks_rejected", cold.corrupt_blocks, m, "ssd", "corrupt")
            put("omlx_cache_blocks_rejected", cold.missing_files, m, "ssd", "missing_file")
    w = state.writer
    if w is not None:
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
            ("unreachable", w.dropped_unreachable),
            ("denied", w.dropped_denied),
            ("closed", w.dropped_closed),
            ("error", w.dropped_error),
        ):
            put("omlx_cache_blocks_dropped", dropped, "all", "ssd", reason)
        put("omlx_cache_write_queue_blocks", w.queued, "all")
    yield from (f for f in families.values() if f.samples)
