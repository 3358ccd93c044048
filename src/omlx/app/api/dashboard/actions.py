"""The dashboard's actions on a live server: unload a model, clear one model's cache, vacuum.

Clearing and vacuuming run the admin commands' own code (``omlx.app.ops.admin``) on the
server's index and store, so the page and ``omlx admin cache`` cannot drift apart. In a
running server they also drop what the disk no longer holds from each model's memory:
a cleared model's hot tier, and the keys its prefix cache believed were on disk (or the
blocks would not be written again). Blocks already queued for disk when a clear runs
are still written; a vacuum never takes a block a running request holds.
"""

from __future__ import annotations

from typing import Any

from omlx.app.errors import Busy, InvalidRequest, NotFound
from omlx.app.wiring.container import Container
from omlx.domain.sizes import parse_size


def unload_model(container: Container, model_id: str) -> dict[str, Any]:
    """Stop serving ``model_id`` now; its blocks on disk stay for when it is loaded again."""
    pool = container.pool
    _known(container, model_id)
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


def clear_model_cache(container: Container, model_id: str) -> dict[str, Any]:
    """Drop ``model_id``'s cached blocks from RAM and disk (blocking: run it on a worker thread)."""
    from omlx.adapters.blockfiles.maintenance import no_progress
    from omlx.app.ops.admin import clear_blocks

    served = next((s for s in container.pool.loaded() if s.id == model_id), None)
    prefix_cache = served.prefix_cache if served is not None else None
    hot_blocks = prefix_cache.clear() if prefix_cache is not None else 0
    ssd_blocks = nbytes = 0
    if container.ssd is not None:
        try:
            cleared = clear_blocks(
                container.ssd.index, container.ssd.store, model_id, progress=no_progress
            )
        except LookupError as exc:
            if served is None and model_id not in container.pool.specs:
                raise NotFound(str(exc), param="model", code="model_not_found") from None
        else:
            ssd_blocks, nbytes = cleared.blocks, cleared.nbytes
    elif served is None:
        _known(container, model_id)
    return {
        "model": model_id,
        "hot_blocks": hot_blocks,
        "ssd_blocks": ssd_blocks,
        "ssd_bytes": nbytes,
    }


def vacuum_cache(container: Container, max_size: str) -> dict[str, Any]:
    """Reconcile the SSD tier and evict its LRU blocks beyond ``max_size`` (blocking)."""
    from omlx.adapters.blockfiles.maintenance import LIVE_GRACE_S, no_progress
    from omlx.app.ops.admin import vacuum_blocks

    try:
        max_bytes = parse_size(max_size)
    except ValueError as exc:
        raise InvalidRequest(f"max_size: {exc}", param="max_size") from None
    ssd = container.ssd
    if ssd is None:
        raise InvalidRequest(
            "this server has no SSD tier to vacuum", param="max_size", code="no_ssd_tier"
        )
    lines: list[str] = []
    freed = vacuum_blocks(
        ssd.index,
        ssd.store,
        grace=LIVE_GRACE_S,  # our own writer's files in flight are younger than this
        max_bytes=max_bytes,
        lease=container.settings.eviction_lease_seconds if ssd.shared else None,
        is_pinned=container.pool.is_pinned,
        say=lines.append,
        progress=no_progress,
    )
    if freed is None:
        raise Busy(
            "another server or admin is reconciling this cache; try again later",
            retry_after=10,
            code="maintenance_busy",
        )
    for served in container.pool.loaded():
        if served.prefix_cache is not None:
            served.prefix_cache.forget_stored()
    return {"max_bytes": max_bytes, "freed_bytes": freed, "report": lines}


def _known(container: Container, model_id: str) -> None:
    if model_id not in container.pool.specs:
        served = ", ".join(container.pool.specs)
        raise NotFound(
            f"no served model {model_id!r} (served: {served})",
            param="model",
            code="model_not_found",
        )
