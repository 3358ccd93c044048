"""What ``GET /v1/dashboard/state`` answers: models, tiers, queue, recent requests, series.

Read from the pool, each model's cache stats and pins (the caller's tenant's, as
``GET /v1/cache/pins`` lists them), the cold tier's index (on a worker thread: it is a
query) and the dashboard's request log and series. Plain JSON values only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

from omlx import __version__
from omlx.app.api.cache_controller import pin_json, pins_of
from omlx.app.api.dashboard.series import RequestSeries
from omlx.app.container import Container
from omlx.app.pool import Served
from omlx.app.request_log import RequestLog

log = logging.getLogger(__name__)

RECENT_REQUESTS = 50


def dashboard_state(
    container: Container,
    log: RequestLog,
    series: RequestSeries,
    ssd: dict[str, Any],
    tenant: str = "",
) -> dict[str, Any]:
    """The whole page's data; ``ssd`` is ``ssd_usage``'s answer (read off the event loop)."""
    pool, settings = container.pool, container.settings
    loaded = {s.id: s for s in pool.loaded()}
    usage = pool.account.snapshot()
    models = [
        _model(pool, spec_id, loaded.get(spec_id), usage.get(spec_id)) for spec_id in pool.specs
    ]
    for model in models:
        known = ssd.get("enabled") and "unavailable" not in ssd
        model["ssd"] = _ssd_of(model, ssd["namespaces"]) if known else None
    hot = [m["cache"]["hot"] for m in models if m.get("cache", {}).get("hot")]
    return {
        "server": {
            "version": __version__,
            "uptime_s": round(time.time() - container.started_at, 1),
            "ready": pool.ready and not container.start_loads,
            "blas": container.blas,
            "auth": bool(settings.api_key),
            "sample_seconds": series.interval,
        },
        "memory": {"limit_bytes": pool.account.limit_bytes, "held_bytes": pool.account.held()},
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
        "requests": [asdict(r) for r in log.recent(RECENT_REQUESTS)],
        "series": {m: [asdict(p) for p in pts] for m, pts in series.points().items()},
        "pins": pins(container, tenant),
    }


def pins(container: Container, tenant: str) -> dict[str, list[dict[str, Any]]]:
    """Each loaded model's live pins of ``tenant``, soonest to expire first, with the TTL left."""
    out: dict[str, list[dict[str, Any]]] = {}
    for served, cache in pins_of(container):
        book = cache.pins
        out[served.id] = [
            {
                **pin_json(served.id, pin, cache.held_blocks(pin.keys)),
                "ttl_left_s": round(book.ttl_left(pin), 1),
            }
            for pin in book.pins(tenant)
        ]
    return out


def _ssd_of(model: dict[str, Any], namespaces: list[dict[str, Any]]) -> dict[str, Any] | None:
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
        }
        return next((ns for ns in namespaces if ns["namespace"] == digest), empty)
    named = [ns for ns in namespaces if ns["model"] == model["id"]]
    return named[-1] if named else None


def _model(
    pool: Any, model_id: str, served: Served | None, held: dict[str, int] | None
) -> dict[str, Any]:
    spec = pool.specs[model_id]
    out: dict[str, Any] = {
        "id": model_id,
        "task": spec.task,
        "state": pool.state(model_id),
        "pinned": model_id in pool.pinned,
        "source": spec.label,
        "error": pool.load_errors.get(model_id),
        "weights_bytes": held["weights"] if held else 0,
        "kv_bytes": held["kv"] if held else 0,
        "active": 0,
        "queued": 0,
    }
    if served is None:
        return out
    engine = served.engine
    out["active"] = getattr(engine, "active", 0)
    out["queued"] = getattr(engine, "queued", 0)
    out["load_seconds"] = round(served.load_seconds, 2)
    budget = getattr(engine, "budget", None)
    out["kv_bytes_per_token"] = getattr(budget, "bytes_per_token", None)
    if served.task == "chat":
        out["cache"] = _cache(served)
    return out


def _cache(served: Served) -> dict[str, Any]:
    prefix_cache = served.prefix_cache
    if prefix_cache is None:
        reason = getattr(served.model, "cache_unsupported_reason", "") or "turned off"
        return {"enabled": False, "disabled_reason": reason}
    s = prefix_cache.stats()
    hot = s.hot
    return {
        "enabled": True,
        "namespace": prefix_cache.namespace.digest,
        "block_size": prefix_cache.block_size,
        "lookups": s.lookups,
        "lookup_tokens": s.lookup_tokens,
        "hit_tokens": s.hit_tokens,
        "hot_hits": s.hot_hits,
        "ssd_hits": s.cold_hits,
        "hot": {"blocks": hot.blocks, "bytes": hot.bytes, "max_bytes": hot.max_bytes},
    }


def ssd_usage(container: Container) -> dict[str, Any]:
    """The cold tier's blocks, bytes and budget, per namespace (index queries: call off the loop).

    An index that cannot answer now (a shared database away, a long lock) is reported as
    such: the rest of the page still draws.
    """
    ssd = container.ssd
    if ssd is None:
        return {"enabled": False}
    try:
        return _ssd_usage(container, ssd)
    except Exception as exc:
        log.warning("dashboard: the SSD tier's index did not answer: %s", exc)
        return {
            "enabled": True,
            "unavailable": f"the index did not answer: {exc}",
            "namespaces": [],
        }


def _ssd_usage(container: Container, ssd: Any) -> dict[str, Any]:
    from omlx.adapters.blockfiles.budget import DiskBudget

    index = ssd.index
    usage = {u.namespace: u for u in index.usage()}
    namespaces = []
    for rec in index.namespace_records():
        u = usage.get(rec.info.digest)
        tokens, nbytes = (u.tokens, u.nbytes) if u else (0, 0)
        namespaces.append(
            {
                "model": rec.info.model_name,
                "namespace": rec.info.digest,
                "block_size": rec.info.block_size,
                "blocks": u.blocks if u else 0,
                "tokens": tokens,
                "bytes": nbytes,
                "bytes_per_token": round(nbytes / tokens, 1) if tokens else None,
            }
        )
    used = sum(ns["bytes"] for ns in namespaces)
    settings = container.settings
    queued = container.writer.stats().queued if container.writer is not None else 0
    return {
        "enabled": True,
        "dir": str(ssd.dir),
        "shared": ssd.shared,
        "blocks": sum(ns["blocks"] for ns in namespaces),
        "tokens": sum(ns["tokens"] for ns in namespaces),
        "bytes": used,
        "max_bytes": DiskBudget(ssd.dir, settings.ssd_cache_bytes).limit(used),
        "configured_max_bytes": settings.ssd_cache_bytes,
        "write_queue": queued,
        "namespaces": namespaces,
    }
