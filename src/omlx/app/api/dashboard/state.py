"""What ``GET /v1/dashboard/state`` answers: models, tiers, queue, recent requests, series.

Drawn from the server's one ``ServerState`` read (as ``/health`` and ``/metrics`` are),
each model's pins (the caller's tenant's, as ``GET /v1/cache/pins`` lists them), the cold
tier's usage (``CacheMaintenance.usage``: index queries, on a worker thread) and the
dashboard's request log and series. Plain JSON values only.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

import msgspec

from omlx.app.api.cache_controller import pin_json
from omlx.app.api.dashboard.series import RequestSeries
from omlx.app.api.health import warm_restart_json
from omlx.app.cache_controls.maintenance import CacheMaintenance
from omlx.app.cache_controls.service import PinView, TenantUsage
from omlx.app.cache_controls.tenants import Caller
from omlx.app.ops.request_log import RequestLog
from omlx.app.ops.status import CacheState, ModelState, ServerState
from omlx.app.settings import Settings
from omlx.domain.json_values import JsonObject

log = logging.getLogger(__name__)

RECENT_REQUESTS = 50


def dashboard_state(
    state: ServerState,
    settings: Settings,
    requests: RequestLog,
    series: RequestSeries,
    ssd: JsonObject,
    pins: dict[str, list[PinView]],
    caller: Caller,
    usage: dict[str, TenantUsage],
) -> JsonObject:
    """The whole page's data as ``caller`` may see it; ``ssd`` is ``ssd_usage``'s answer (read
    off the event loop), ``pins`` and ``usage`` the caller's tenant's.

    An operator sees every request, but the excerpts of where a prompt left the cache only
    for its own tenant's: reports reveal the caller's own prompts alone. A tenant sees its
    own requests, series, pins and usage per model, and nothing of the tiers' contents,
    the other tenants' counts or the operator's actions.
    """
    tenant = caller.tenant or ""
    scope = None if caller.operator else tenant  # whose requests: every tenant's, or its own
    models = [_model(m) for m in state.models]
    for model in models:
        known = ssd.get("enabled") and "unavailable" not in ssd
        model["ssd"] = _ssd_of(model, ssd["namespaces"]) if known else None
    hot = [m["cache"]["hot"] for m in models if m.get("cache", {}).get("hot")]
    out: JsonObject = {
        "server": {
            "version": state.version,
            "uptime_s": state.uptime_s,
            "ready": state.ready,
            "blas": state.blas,
            "auth": bool(settings.api_key or settings.api_keys_file),
            "role": caller.role,
            "tenant": caller.tenant,
            "sample_seconds": series.interval,
        },
        "memory": {"limit_bytes": state.memory_limit, "held_bytes": state.memory_held},
        "models": models,
        "tiers": {
            "hot": {
                "blocks": sum(h["blocks"] for h in hot),
                "bytes": sum(h["bytes"] for h in hot),
                "max_bytes": sum(h["max_bytes"] for h in hot),
                # None with "auto": each model's own budget is in its max_bytes.
                "max_bytes_per_model": settings.hot_cache_bytes,
            },
            "ssd": ssd,
        },
        "queue": {
            "active": sum(m["active"] for m in models),
            "queued": sum(m["queued"] for m in models),
            "max_concurrent": settings.max_concurrent_requests,
            "max_queued": settings.max_queued_requests,
        },
        "requests": [
            _without_others_excerpts(asdict(r), tenant)
            for r in requests.recent(RECENT_REQUESTS, tenant=scope)
        ],
        "series": {m: [asdict(p) for p in pts] for m, pts in series.points(scope).items()},
        "pins": pins_json(pins),
    }
    if not caller.operator:
        out["models"] = [_tenant_model(m, usage) for m in models]
        out["tiers"] = None
    return out


def _tenant_model(model: JsonObject, usage: dict[str, TenantUsage]) -> JsonObject:
    """A model's row without the cache's contents, with the tenant's own counts instead."""
    own = {k: v for k, v in model.items() if k not in ("cache", "ssd", "images")}
    use = usage.get(model["id"])
    if use is not None:
        own["cache"] = {
            "enabled": True,
            "lookups": use.lookups,
            "lookup_tokens": use.prompt_tokens,
            "hit_tokens": use.cached_tokens,
        }
    return own


def _without_others_excerpts(record: JsonObject, tenant: str) -> JsonObject:
    """Another tenant's record without its prompt excerpts or its session's name."""
    if record.get("tenant", "") == tenant:
        return record
    divergence = record.get("divergence")
    if divergence is not None:
        divergence = {**divergence, "prompt": "", "cached": ""}
    return {**record, "divergence": divergence, "session": ""}


def pins_json(pins: dict[str, list[PinView]]) -> dict[str, list[JsonObject]]:
    """Each loaded model's live pins, soonest to expire first, with the TTL left."""
    return {
        model: [
            {**msgspec.to_builtins(pin_json(model, view)), "ttl_left_s": round(view.ttl_left, 1)}
            for view in views
        ]
        for model, views in pins.items()
    }


def _ssd_of(model: JsonObject, namespaces: list[JsonObject]) -> JsonObject | None:
    """A loaded model's namespace on disk; for one not loaded, the newest-listed of its name."""
    digest = model.get("cache", {}).get("namespace")
    if digest is not None:  # none on disk yet, or all cleared: the row goes with the blocks
        empty = {
            "model": model["id"],
            "namespace": digest,
            "blocks": 0,
            "tokens": 0,
            "bytes": 0,
            "bytes_per_token": None,
            "image_objects": 0,
            "image_bytes": 0,
        }
        return next((ns for ns in namespaces if ns["namespace"] == digest), empty)
    named = [ns for ns in namespaces if ns["model"] == model["id"]]
    return named[-1] if named else None


def _model(m: ModelState) -> JsonObject:
    out: JsonObject = {
        "id": m.id,
        "task": m.task,
        "state": m.state,
        "pinned": m.pinned,
        "source": m.source,
        "error": m.error,
        "weights_bytes": m.weights_bytes,
        "kv_bytes": m.kv_bytes,
        "active": m.active,
        "queued": m.queued,
    }
    if not m.loaded:
        return out
    out["load_seconds"] = round(m.load_seconds, 2)
    out["kv_bytes_per_token"] = m.kv_bytes_per_token
    if m.cache is not None:
        out["cache"] = _cache(m.cache)
    if m.images is not None:  # a VLM: its images' rows in RAM, encoder passes, hits by tier
        out["images"] = m.images
    return out


def _cache(c: CacheState) -> JsonObject:
    s = c.stats
    if s is None:
        return {"enabled": False, "disabled_reason": c.disabled_reason or "turned off"}
    hot = s.hot
    return {
        "enabled": True,
        "namespace": c.namespace,
        "block_size": c.block_size,
        "lookups": s.lookups,
        "lookup_tokens": s.lookup_tokens,
        "hit_tokens": s.hit_tokens,
        "hot_hits": s.hot_hits,
        "ssd_hits": s.cold_hits,
        "hot": {"blocks": hot.blocks, "bytes": hot.bytes, "max_bytes": hot.max_bytes},
        # The start's prefetch of the last run's hot set (as on /health).
        "warm_restart": warm_restart_json(c.warm_restart) if c.warm_restart else None,
    }


def ssd_usage(maintenance: CacheMaintenance | None) -> JsonObject:
    """The cold tier's blocks, bytes and budget, per namespace (index queries: call off the loop).

    An index that cannot answer now (a shared database away, a long lock) is reported as
    such: the rest of the page still draws.
    """
    if maintenance is None:
        return {"enabled": False}
    try:
        return maintenance.usage()
    except Exception as exc:
        log.warning("dashboard: the SSD tier's index did not answer: %s", exc)
        return {
            "enabled": True,
            "unavailable": f"the index did not answer: {exc}",
            "namespaces": [],
        }
