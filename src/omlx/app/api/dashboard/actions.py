"""The dashboard's actions on a live server: unload a model, clear one model's cache, vacuum.

Clearing and vacuuming are ``CacheMaintenance``'s, the admin commands' own code, so the
page and ``omlx admin cache`` cannot drift apart; unloading is the pool's.
"""

from __future__ import annotations

from omlx.app.cache_controls.maintenance import CacheMaintenance
from omlx.app.errors import Busy, InvalidRequest, NotFound
from omlx.app.models.pool import ModelPool
from omlx.domain.json_values import JsonObject
from omlx.domain.sizes import parse_size


def unload_model(pool: ModelPool, model_id: str) -> JsonObject:
    """Stop serving ``model_id`` now; its blocks on disk stay for when it is loaded again."""
    _known(pool, model_id)
    if pool.state(model_id) != "loaded":
        raise InvalidRequest(
            f"the model {model_id!r} is not loaded", param="model", code="model_not_loaded"
        )
    if model_id in pool.pinned:
        raise InvalidRequest(
            f"the model {model_id!r} is pinned (--pin-model) and stays loaded",
            param="model",
            code="model_pinned",
        )
    if not pool.unload(model_id):
        raise Busy(
            f"the model {model_id!r} is serving requests; retry when it is idle",
            retry_after=5,
            code="model_busy",
        )
    return {"model": model_id, "state": pool.state(model_id)}


def clear_model_cache(
    pool: ModelPool, maintenance: CacheMaintenance | None, model_id: str
) -> JsonObject:
    """Drop ``model_id``'s cached blocks from RAM and disk (blocking: run it on a worker thread)."""
    served = next((s for s in pool.loaded() if s.id == model_id), None)
    controls = served.controls if served is not None else None
    hot_blocks = controls.clear() if controls is not None else 0
    ssd_blocks = nbytes = 0
    if maintenance is not None:
        try:
            cleared = maintenance.clear(model_id)
        except LookupError as exc:  # nothing of it on disk: a served model's is an empty clear
            if served is None and model_id not in pool.specs:
                raise NotFound(str(exc), param="model", code="model_not_found") from None
        else:
            ssd_blocks, nbytes = cleared.blocks, cleared.nbytes
    elif served is None:
        _known(pool, model_id)
    return {
        "model": model_id,
        "hot_blocks": hot_blocks,
        "ssd_blocks": ssd_blocks,
        "ssd_bytes": nbytes,
    }


def vacuum_cache(maintenance: CacheMaintenance | None, max_size: str) -> JsonObject:
    """Reconcile the SSD tier and evict its LRU blocks beyond ``max_size`` (blocking)."""
    try:
        max_bytes = parse_size(max_size)
    except ValueError as exc:
        raise InvalidRequest(f"max_size: {exc}", param="max_size") from None
    if maintenance is None:
        raise InvalidRequest(
            "this server has no SSD tier to vacuum", param="max_size", code="no_ssd_tier"
        )
    done = maintenance.vacuum(max_bytes)
    if done is None:
        raise Busy(
            "another server or admin is reconciling this cache; try again later",
            retry_after=10,
            code="maintenance_busy",
        )
    return {"max_bytes": done.max_bytes, "freed_bytes": done.freed_bytes, "report": done.report}


def _known(pool: ModelPool, model_id: str) -> None:
    if model_id not in pool.specs:
        served = ", ".join(pool.specs)
        raise NotFound(
            f"no served model {model_id!r} (served: {served})",
            param="model",
            code="model_not_found",
        )
