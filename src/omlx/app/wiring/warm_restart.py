"""Warm restart's wiring: one model cache's hot set file and its prefetch-and-record thread."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from omlx.app.settings import Settings
from omlx.domain.cache.prime import PRIMED

if TYPE_CHECKING:
    from omlx.domain.cache.cold_tier import ColdTier
    from omlx.domain.cache.prefix_cache import PrefixCache
    from omlx.domain.cache.warm_restart import WarmRestart
    from omlx.domain.ports import GenerationEngine

log = logging.getLogger(__name__)

PRIME_WAIT_S = 600.0  # a request may hold the engine; then the priming is dropped anyway


def warm_restart_for(
    settings: Settings,
    prefix_cache: PrefixCache | None,
    cold_tier: ColdTier | None,
    engine: GenerationEngine,
    *,
    shared: bool = False,
) -> WarmRestart | None:
    """A model cache's warm restart, not started yet; None when it is off (the setting, or
    no SSD tier to read from). ``shared``: the folder is shared by servers, each keeping
    its own hot set (named by its ``server_identity``)."""
    if prefix_cache is None or cold_tier is None:
        return None
    if not settings.warm_restart:
        log.info("warm restart of %s: off (--no-warm-restart)", prefix_cache.namespace.model_name)
        return None
    from omlx.adapters.blockfiles.hot_set_file import HotSetFile, hot_set_path
    from omlx.domain.cache.warm_restart import WarmRestart

    digest = prefix_cache.namespace.digest
    path = hot_set_path(settings.cache_dir, digest, settings.server_identity if shared else "")
    return WarmRestart(
        namespace=digest,
        hot=prefix_cache.hot,
        cold=cold_tier,
        store=HotSetFile(path),
        nbytes=prefix_cache.codec.nbytes,
        # Requests first: the prefetch waits while one is queued or running.
        busy=lambda: bool(engine.active or engine.queued),
        prime=_primer(prefix_cache, engine),
        record_every=settings.warm_restart_record_seconds,
    )


def _primer(
    prefix_cache: PrefixCache, engine: GenerationEngine
) -> Callable[[Sequence[str]], None] | None:
    """What hands the latest conversation's chain to the engine, to join into a kept cache
    when it is idle (``PrefixCache.prime``); None for an engine that cannot run it."""
    when_idle = getattr(engine, "when_idle", None)
    if when_idle is None:
        return None

    def run(keys: Sequence[str]) -> None:
        if not when_idle(partial(prime, keys)).result(timeout=PRIME_WAIT_S):
            log.info("warm restart: a request came first; the latest conversation not primed")

    def prime(keys: Sequence[str]) -> None:
        started = time.perf_counter()
        outcome = prefix_cache.prime(keys)
        log.info(
            "warm restart: the latest conversation (%d blocks) %s in %.2f s",
            len(keys),
            "kept for its next turn" if outcome == PRIMED else f"not kept: {outcome}",
            time.perf_counter() - started,
        )

    return run
