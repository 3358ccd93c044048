"""Admitted requests waiting for a running request's prefill of their prefix (on the engine
thread): the engine's side of ``domain.shared_prefill``.

The engine offers each admitted request here before it joins the batch (``hold``) and asks
after every step which may go (``ready``); a request that waited looks its prompt up again
when it joins, so it restores what its leader kept. Chain keys are hashed once per request
(the app's probe usually has them) and only for requests that may share: the same chain
root and the same first block.

Plain attention layouts only: a hybrid or sliding-window model restores at restore points,
which a leader captures on a lattice of its own prompt's length, so a follower could wait
for blocks and then restore much less of them than it waited for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Iterator
from typing import TYPE_CHECKING

from omlx.adapters.mlx.batch.jobs import Job
from omlx.domain.cache.keys import chain_keys
from omlx.domain.shared_prefill import Prefilling, SharedPrefill, shared_blocks

if TYPE_CHECKING:
    from omlx.domain.cache.prefix_cache import PrefixCache

log = logging.getLogger("omlx.adapters.mlx.batch.engine")  # the engine's own lines


class Followers:
    """Jobs held out of the batch while a leader prefills what they would restore."""

    def __init__(self, prefix_cache: PrefixCache | None, step_size: int) -> None:
        self._cache = prefix_cache
        plain = prefix_cache is not None and prefix_cache.layout.plain
        self._room = SharedPrefill(prefix_cache.block_size, step_size) if plain else None
        self._held: dict[int, Job] = {}  # job id -> job, in the order they were held

    def __bool__(self) -> bool:
        return bool(self._held)

    def __iter__(self) -> Iterator[Job]:
        return iter(list(self._held.values()))

    def hold(self, job: Job, running: Iterable[Job], step: int) -> bool:
        """Whether ``job``, just admitted, waits for one of the ``running`` jobs' prefill."""
        if self._room is None:
            return False
        wait = self._room.wait(
            job.id, self._keys(job), self._leaders(job, running), self._held_blocks, step
        )
        if wait is None:
            return False
        self._held[job.id] = job
        job.times["held"] = time.monotonic()
        log.debug(
            "request %d waits for request %d's prefill: %d of its first %d blocks in flight",
            job.id,
            wait.leader,
            wait.in_flight,
            wait.blocks,
        )
        return True

    def ready(self, running: Collection[Job], step: int) -> Iterator[Job]:
        """The held jobs that go now, one at a time: their leader kept the blocks, left or
        stalled, and no other running job is worth waiting for. ``running``: a live view of
        the batch, so a job the engine starts before asking for the next is a leader too."""
        if self._room is None:
            return
        for job in list(self._held.values()):
            kept = {other.id: other.kept for other in running}
            if self._room.still_waiting(job.id, kept, step):
                continue
            waited = self._room.waiting_for(job.id)
            if self._room.wait(
                job.id, self._keys(job), self._leaders(job, running), self._held_blocks, step
            ):
                continue
            del self._held[job.id]
            if waited is not None:
                log.info(
                    "request %d waited %.3f s for request %d's prefill of its first %d blocks",
                    job.id,
                    time.monotonic() - job.times["held"],
                    waited.leader,
                    waited.blocks,
                )
            yield job

    def in_flight(self, job: Job, running: Iterable[Job]) -> int:
        """Positions past ``job``'s restored prefix that a running request shares with it
        and has not kept yet: a prefix being computed as ``job`` starts (its report says so,
        not that the cache missed). Any layout: a hybrid's request computes it beside the
        other; a plain one's does where waiting for it would cost more than computing."""
        if self._cache is None:
            return 0
        others = [o for o in self._sharing(job, running) if o.id != job.id]
        if not others:
            return 0
        bs, keys = self._cache.block_size, self._keys(job)
        mine = job.request.prompt_tokens
        furthest = 0
        for other in others:
            # The whole blocks they share, then the tokens of the next one up to where the
            # prompts part (restored token by token once the other keeps that block).
            shared = shared_blocks(keys, self._keys(other)) * bs
            theirs = other.request.prompt_tokens
            end = min(len(mine) - 1, len(theirs), shared + bs)
            while shared < end and mine[shared] == theirs[shared]:
                shared += 1
            if other.kept < shared:
                furthest = max(furthest, shared)
        return max(furthest - job.cached_tokens, 0)

    def withdraw(self, job: Job) -> bool:
        """Take a held job out (cancelled); whether it was held."""
        if self._held.pop(job.id, None) is None:
            return False
        assert self._room is not None
        self._room.forget(job.id)
        return True

    def _held_blocks(self, keys: list[str]) -> int:
        assert self._cache is not None
        return self._cache.held_blocks(keys)

    def _leaders(self, job: Job, running: Iterable[Job]) -> list[Prefilling]:
        """The running jobs that may share ``job``'s first blocks and keep what they compute."""
        return [
            Prefilling(other.id, self._keys(other), other.kept)
            for other in self._sharing(job, running)
        ]

    def _sharing(self, job: Job, running: Iterable[Job]) -> list[Job]:
        """The running jobs of ``job``'s tenant that start with its first block and keep what
        they compute (the others' blocks are no use to it)."""
        bs = self._cache.block_size
        first = job.request.prompt_tokens[:bs]
        tenant = job.request.cache_tenant
        return [
            other
            for other in running
            if other.session is not None
            and other.session.store
            and other.request.cache_tenant == tenant
            and other.request.prompt_tokens[:bs] == first
        ]

    def _keys(self, job: Job) -> tuple[str, ...]:
        """The chain keys of the whole blocks its lookup may restore (hashed once)."""
        if job.keys is None:
            cache = self._cache
            root = cache.root_of(job.request.cache_tenant) or cache.namespace.digest
            probed = job.request.cache_probe
            if probed is not None and probed.chain is not None and probed.chain.root == root:
                job.keys = tuple(probed.chain.keys)
            else:
                tokens = job.request.prompt_tokens
                bs = cache.block_size
                whole = max(len(tokens) - 1, 0) // bs * bs  # never the last token (``lookup``)
                job.keys = tuple(chain_keys(root, tokens[:whole], bs))
        return job.keys
