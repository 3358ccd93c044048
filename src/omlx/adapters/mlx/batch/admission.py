"""A request's way into the batch: its prefix looked up and pinned, room made for its KV,
its cache restored (or made fresh), and its uncached tail cut at block boundaries."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omlx.adapters.mlx.batch.jobs import Job
from omlx.domain.memory import format_bytes

if TYPE_CHECKING:
    from omlx.domain.cache.prefix_cache import PrefixCache
    from omlx.domain.cache.session import CacheSession

log = logging.getLogger("omlx.adapters.mlx.batch.engine")  # the engine's own lines


def begin(prefix_cache: PrefixCache, job: Job) -> CacheSession:
    """Its prompt looked up, its prefix pinned (the prefix cache's session for it)."""
    job.times.setdefault("considered", time.monotonic())
    request = job.request
    return prefix_cache.begin(
        request.prompt_tokens,
        store=request.cache_store,
        tenant=request.cache_tenant,
        probed=request.cache_probe,  # the app's probe: no second hash, no second query
    )


def make_room(prefix_cache: PrefixCache, job: Job, room: int) -> int:
    """The prefix cache gives RAM back for ``job`` (its own prefix pinned first); bytes left
    beside the kept cache ``job`` will continue (``PrefixCache.make_room``)."""
    if job.session is None:  # pin its prefix: the shrink must not evict what it will restore
        job.session = begin(prefix_cache, job)
    before = prefix_cache.held_bytes()
    left = prefix_cache.make_room(room, job.session)
    given = before - prefix_cache.held_bytes()
    if given > 0:
        log.info(
            "memory guard: the prefix cache gave back %s for request %d",
            format_bytes(given),
            job.id,
        )
    return left


def look_again(job: Job) -> None:
    """A request that waited for another's prefill lets its first lookup go: joining the
    batch, it looks its prompt up afresh and restores what the other kept meanwhile."""
    if job.session is not None:
        job.session.close()
        job.session = None


def starting_cache(
    prefix_cache: PrefixCache | None, job: Job, fresh: Callable[[], list[Any]] | None
) -> list[Any] | None:
    """The cache a request starts from: its restored prefix (``job.cached_tokens`` set),
    else a fresh one in exact mode (``fresh``), else None (mlx-lm makes one)."""
    job.times.setdefault("considered", time.monotonic())
    cache = None
    if prefix_cache is not None:
        if job.session is None:
            job.session = begin(prefix_cache, job)
        cache = job.session.restore()
        job.cached_tokens = job.session.cached_tokens
    if cache is None and fresh is not None:
        cache = fresh()  # every row of a batch must be of one cache class
    return cache


def segments(
    tokens: list[int], start: int, plan: tuple[int, ...], block_size: int | None, step_size: int
) -> list[list[int]]:
    """The uncached tail, cut so that every prefill chunk ends on a block boundary.

    mlx-lm's batcher never lets a chunk span two segments and reports each segment's
    end: segments end at multiples of the chunk size (a multiple of the block size)
    and at the restore points the request's capture plans. No block size: one segment.
    """
    if block_size is None:
        return [tokens[start:]]
    step = block_size * max(1, step_size // block_size)
    cuts = set(range((start // step + 1) * step, len(tokens), step))
    cuts.update(p for p in plan if start < p < len(tokens))
    edges = [start, *sorted(cuts), len(tokens)]
    return [tokens[a:b] for a, b in itertools.pairwise(edges) if b > a]
