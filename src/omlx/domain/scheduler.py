"""Admission: which waiting request joins a model's running batch, and when.

First come, first served into a batch of at most ``max_concurrent`` requests, within the
KV memory the model may use (its ``KVBudget`` and, with several models, what the
process-wide ``MemoryAccount`` leaves it). The head of the queue waits for memory rather
than being overtaken, so a large request is never starved by a stream of small ones; a
request that could not fit even alone is refused. Before a request waits, the model's hot
tier gives memory back (the engine's ``make_room``). Pure: the engine owns the jobs and
MLX, this owns the decisions, and unit tests drive it with plain objects.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Protocol

from omlx.domain.memory import KVBudget, MemoryAccount
from omlx.domain.sizes import format_bytes

log = logging.getLogger(__name__)


class Verdict(Enum):
    ADMIT = "admit"
    WAIT = "wait"  # fits alone, not beside the running requests
    REFUSE = "refuse"  # never fits


class Queued(Protocol):
    """What the scheduler needs of a waiting request."""

    id: int
    waited_epoch: int  # the batch state in which it last had to wait

    @property
    def length(self) -> int:
        """Cache positions it may reach: its prompt plus every token it may generate."""
        ...


# make_room(job, room): free RAM of the model's prefix cache (kept finished caches, hot tier)
# until it holds at most ``room`` bytes (pinning the job's own cached prefix first, and not
# counting the kept cache the job will continue: its KV is in the job's own need); returns
# the bytes it still holds.
MakeRoom = Callable[[Queued, int], int]


class Scheduler:
    def __init__(
        self,
        max_concurrent: int,
        budget: KVBudget | None = None,
        account: MemoryAccount | None = None,
        model: str = "",
    ) -> None:
        self.max_concurrent = max_concurrent
        self.budget = budget
        self.account = account
        self.model = model
        self._waiting: deque[Queued] = deque()
        self._running: dict[int, int] = {}  # job id -> length
        self._epoch = 0  # bumped whenever the running set changes (memory verdicts expire)
        self._memory_blocked = False
        self._count_lock = threading.Lock()
        self._submitted = 0  # written under the lock by submitters
        self._dequeued = 0  # written by the engine thread only
        self.active = 0

    # ---- any thread ----------------------------------------------------------------

    def note_submitted(self) -> None:
        with self._count_lock:
            self._submitted += 1

    @property
    def queued(self) -> int:
        """Requests waiting for a batch slot (for 429s, /health, metrics).

        Submitted but not yet admitted, less those that free slots will take at the
        engine's next look: two requests arriving together at an idle server do not count
        as a queue. While the head of the queue waits for memory, all of them do.
        """
        pending = self._submitted - self._dequeued
        if self._memory_blocked:
            return pending
        return max(0, pending - max(0, self.max_concurrent - self.active))

    @property
    def kv_token_capacity(self) -> int | None:
        """The most positions (prompt + max_tokens) one request may use; None: no guard."""
        return None if self.budget is None else self.budget.token_capacity

    # ---- the engine thread -------------------------------------------------------------

    def enqueue(self, job: Queued) -> None:
        self._waiting.append(job)

    @property
    def has_waiting(self) -> bool:
        return bool(self._waiting)

    def withdraw(self, job: Queued) -> None:
        """A waiting request left (cancelled)."""
        self._waiting.remove(job)
        self._dequeued += 1
        if not self._waiting:
            self._memory_blocked = False

    def admissible(self, make_room: MakeRoom | None = None) -> Iterator[tuple[Queued, Verdict]]:
        """Waiting requests that leave the queue now, in order, each with ADMIT or REFUSE.

        Stops at a full batch or at a head that must wait; the caller starts (``started``)
        each admitted one before asking for the next.
        """
        while self._waiting and len(self._running) < self.max_concurrent:
            job = self._waiting[0]
            verdict = self._verdict(job, make_room)
            self._memory_blocked = verdict is Verdict.WAIT
            if verdict is Verdict.WAIT:
                return
            self._waiting.popleft()
            self._dequeued += 1
            yield job, verdict

    def started(self, job: Queued) -> None:
        self._running[job.id] = job.length
        self._epoch += 1
        self.active = len(self._running)

    def ended(self, job_id: int) -> None:
        if self._running.pop(job_id, None) is not None:
            self._epoch += 1
        self.active = len(self._running)

    def clear(self) -> None:
        """Every running request ended at once (the batch failed)."""
        self._running.clear()
        self._epoch += 1
        self.active = 0

    def reserved_bytes(self) -> int:
        """The running batch's KV reservation."""
        return self.budget.batch_bytes(self._running.values()) if self.budget is not None else 0

    def limit_bytes(self) -> int | None:
        """The KV this model may use now: its own limit, and what other models leave it."""
        if self.budget is None:
            return None
        room = self.account.room_for_kv(self.model) if self.account is not None else None
        return self.budget.limit_bytes if room is None else min(self.budget.limit_bytes, room)

    def refusal(self, job: Queued, prompt: int, new: int) -> str:
        budget = self.budget
        assert budget is not None
        limit = self.limit_bytes()
        if (
            limit is not None
            and limit < budget.limit_bytes
            and not budget.fits_alone(job.length, limit)
        ):
            return (
                f"this request needs {format_bytes(budget.batch_bytes([job.length]))} of KV cache "
                f"({prompt} prompt + {new} max_tokens tokens); beside the other loaded models "
                f"max_model_memory leaves {format_bytes(limit)}: lower max_tokens, shorten the "
                "prompt, or unload a model"
            )
        return (
            f"this request needs {format_bytes(budget.batch_bytes([job.length]))} of KV cache "
            f"({prompt} prompt + {new} max_tokens tokens), more than kv_memory_limit "
            f"({format_bytes(budget.limit_bytes)}) allows; at most {budget.token_capacity} "
            "tokens in all: lower max_tokens or shorten the prompt"
        )

    def _verdict(self, job: Queued, make_room: MakeRoom | None) -> Verdict:
        budget = self.budget
        if budget is None:
            return Verdict.ADMIT
        if not budget.fits_alone(job.length):
            return Verdict.REFUSE
        if job.waited_epoch == self._epoch:
            return Verdict.WAIT  # nothing finished since the last look
        limit = self.limit_bytes()
        assert limit is not None
        need = budget.batch_bytes([*self._running.values(), job.length])
        if need > limit:
            if (
                not self._running
                and self.account is not None
                and not self.account.others_kv(self.model)
            ):
                return Verdict.REFUSE  # only other models' weights stand in the way: no wait ends
            return self._wait(job, need, limit, "the running requests")
        if make_room is not None and make_room(job, limit - need) > limit - need and self._running:
            return self._wait(job, need, limit, "the running requests and pinned cache blocks")
        return Verdict.ADMIT

    def _wait(self, job: Queued, need: int, limit: int, beside: str) -> Verdict:
        if job.waited_epoch < 0:
            log.info(
                "memory guard: request %d waits: %s of KV beside %s exceeds the %s it may use",
                job.id,
                format_bytes(need),
                beside,
                format_bytes(limit),
            )
        job.waited_epoch = self._epoch
        return Verdict.WAIT
