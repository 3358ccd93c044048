"""Liveness and state: answers without touching the engine thread.

Anyone may ask whether the server is up and ready; a tenant's key adds each model's state;
the engine's and the cache's counters (every tenant's requests together: what was
restored, from where) are an operator's, as ``/metrics`` is.
"""

from __future__ import annotations

from dataclasses import asdict

from litestar import Controller, Request, get

from omlx.app.api.auth import PUBLIC, caller_of
from omlx.app.ops.status import CacheState, ModelState, ServerState, ServerStatus
from omlx.domain.cache.prefetch import OFF, PrefetchProgress
from omlx.domain.json_values import JsonObject

# Every answer names the server: ``omlx launch`` tells an omlx already on a port from
# anything else holding it, before it has a key.
SERVER = "omlx"


def health_json(state: ServerState) -> JsonObject:
    """``GET /health``: readiness, each model's state and cache, memory, the BLAS in use."""
    models = {m.id: _model(m) for m in state.models}
    first = next((m for m in state.models if m.loaded and m.task == "chat"), None)
    loaded = [m for m in state.models if m.loaded]
    return {
        "status": "ok",
        "server": SERVER,
        # False while a model named at start is still loading (requests wait for it).
        "ready": state.ready,
        **_waiting(state),
        "model": first.id if first is not None else state.models[0].id,
        "engine": {
            "active": sum(m.active for m in loaded),
            "queued": sum(m.queued for m in loaded),
        },
        "cache": models[first.id]["cache"] if first is not None else {"enabled": False},
        "models": models,
        "memory": {
            "max_model_memory": state.memory_limit,
            "held": state.memory_held,
            "by_model": state.memory_by_model,
        },
        "blas": state.blas,
    }


def _waiting(state: ServerState) -> JsonObject:
    """While the server is not ready, what it is waiting for (``domain.startup``)."""
    return {} if state.ready else {"waiting_for": list(state.waiting_for)}


def _model(m: ModelState) -> JsonObject:
    out: JsonObject = {"state": m.state, "task": m.task}
    if m.error is not None:
        out["error"] = m.error
    if not m.loaded:
        return out
    out["engine"] = {"active": m.active, "queued": m.queued}
    out["weights_bytes"] = m.weights_bytes
    out["load_seconds"] = round(m.load_seconds, 3)
    if m.cache is not None:
        out["cache"] = _cache(m.cache)
    if m.images is not None:
        out["images"] = m.images
    return out


def _cache(c: CacheState) -> JsonObject:
    out: JsonObject = {"enabled": c.enabled}
    if c.disabled_reason is not None:
        out["disabled_reason"] = c.disabled_reason
    if c.layout is not None:  # what each layer keeps: kv, window W, state
        out["layout"] = c.layout
    s = c.stats
    if s is not None:
        out["block_size"] = c.block_size
        out["hot"] = asdict(s.hot)
        # What lookups restored, partial blocks included: ``hot.hits`` counts only whole
        # blocks found in RAM, so a replay restored from partial blocks showed 0 hits there.
        out["restored"] = {
            "lookups": s.lookups,
            "tokens": s.hit_tokens,
            "blocks_from_ram": s.hot_hits,
            "blocks_from_disk": s.cold_hits,
            "partial_blocks": s.partial_hits,
            "partial_tokens": s.partial_tokens,
        }
        out["ssd"] = c.cold is not None
    if c.warm_restart is not None:
        out["warm_restart"] = warm_restart_json(c.warm_restart)
    return out


def warm_restart_json(p: PrefetchProgress) -> JsonObject:
    """The start's prefetch of the last run's hot set: how far it got, of how much."""
    out: JsonObject = {"state": p.state}
    if p.state == OFF:
        return out
    out |= {
        "blocks": p.blocks,
        "blocks_total": p.planned_blocks,
        "bytes": p.bytes,
        "bytes_total": p.planned_bytes,
        "already_in_ram": p.held,  # a request read them before the prefetch did
        "skipped": p.skipped,  # missing or damaged on disk
        "seconds": p.seconds,
    }
    if p.ended:
        out["ended"] = p.ended  # before the list did: "budget full" or "stopped"
    return out


class HealthController(Controller):
    path = "/health"
    tags = ("health",)

    @get(
        operation_id="health",
        summary="Readiness without an API key; the models' states with a tenant's; "
        "the engine's and cache's state with an operator's",
        opt={PUBLIC: True},
    )
    async def health(self, request: Request, status: ServerStatus) -> JsonObject:
        state = status.read()
        caller = caller_of(request)
        if caller is None:  # no key: what a load balancer needs, nothing of the cache
            return {"status": "ok", "server": SERVER, "ready": state.ready}
        if not caller.operator:  # a tenant: nothing of the other tenants' traffic
            models = {m.id: {"state": m.state, "task": m.task} for m in state.models}
            return {"status": "ok", "server": SERVER, "ready": state.ready, "models": models}
        return health_json(state)
