"""The pure scheduler: first come first served, batch size, memory verdicts, several models."""

from __future__ import annotations

from dataclasses import dataclass

from omlx.domain.memory import CACHE_STEP, KVBudget, KVCost, MemoryAccount
from omlx.domain.scheduler import Scheduler, Verdict

BPT = 100  # bytes per position


@dataclass(eq=False)
class Job:
    id: int
    length: int
    waited_epoch: int = -1


def admit_all(s: Scheduler, make_room=None) -> list[tuple[int, Verdict]]:
    out = []
    for job, verdict in s.admissible(make_room):
        out.append((job.id, verdict))
        if verdict is Verdict.ADMIT:
            s.started(job)
    return out


def test_first_come_first_served_up_to_the_batch_size():
    s = Scheduler(max_concurrent=2)
    jobs = [Job(i, 10) for i in range(4)]
    for job in jobs:
        s.note_submitted()
        s.enqueue(job)
    assert s.queued == 2  # two slots free: two of the four are about to be taken
    assert admit_all(s) == [(0, Verdict.ADMIT), (1, Verdict.ADMIT)]
    assert s.active == 2 and s.queued == 2
    s.ended(0)
    assert admit_all(s) == [(2, Verdict.ADMIT)]
    s.withdraw(jobs[3])
    assert not s.has_waiting and s.queued == 0


def test_a_request_that_never_fits_is_refused_and_one_that_fits_alone_waits():
    budget = KVBudget(limit_bytes=3 * CACHE_STEP * BPT, bytes_per_token=BPT)  # 768 positions
    s = Scheduler(max_concurrent=4, budget=budget)
    big, a, b = Job(1, 1000), Job(2, 400), Job(3, 300)  # a and b: 512 positions each
    for job in (big, a, b):
        s.note_submitted()
        s.enqueue(job)
    assert admit_all(s) == [(1, Verdict.REFUSE), (2, Verdict.ADMIT)]
    assert s.has_waiting and s.queued == 1  # b waits: 2 x 512 > 768
    assert "1000" not in s.refusal(big, 900, 100) and "kv_memory_limit" in s.refusal(big, 900, 100)
    assert admit_all(s) == []  # nothing finished since: not even re-checked
    s.ended(2)
    assert admit_all(s) == [(3, Verdict.ADMIT)]


def test_the_hot_tier_gives_room_before_a_request_waits():
    budget = KVBudget(limit_bytes=4 * CACHE_STEP * BPT, bytes_per_token=BPT)
    s = Scheduler(max_concurrent=4, budget=budget)
    hot = {"bytes": 2 * CACHE_STEP * BPT}
    asked = []

    def make_room(job, room):
        asked.append((job.id, room))
        hot["bytes"] = min(hot["bytes"], room)
        return hot["bytes"]

    first, second = Job(1, 200), Job(2, 200)
    for job in (first, second):
        s.enqueue(job)
    assert admit_all(s, make_room) == [(1, Verdict.ADMIT), (2, Verdict.ADMIT)]
    assert asked == [(1, 3 * CACHE_STEP * BPT), (2, 2 * CACHE_STEP * BPT)]
    assert hot["bytes"] == 2 * CACHE_STEP * BPT


def test_pinned_hot_blocks_make_a_request_wait_beside_running_ones():
    budget = KVBudget(limit_bytes=3 * CACHE_STEP * BPT, bytes_per_token=BPT)
    s = Scheduler(max_concurrent=4, budget=budget)
    running, late = Job(1, 200), Job(2, 200)
    s.enqueue(running)
    assert admit_all(s, lambda job, room: 0) == [(1, Verdict.ADMIT)]
    s.enqueue(late)
    # the hot tier cannot shrink under what its pins hold: wait rather than overcommit
    assert admit_all(s, lambda job, room: room + 1) == []
    assert late.waited_epoch >= 0


def test_several_models_share_one_account():
    account = MemoryAccount(limit_bytes=10 * CACHE_STEP * BPT)
    account.set_weights("a", 4 * CACHE_STEP * BPT)
    account.set_weights("b", 4 * CACHE_STEP * BPT)
    budget = KVBudget(limit_bytes=6 * CACHE_STEP * BPT, bytes_per_token=BPT)
    s = Scheduler(max_concurrent=4, budget=budget, account=account, model="a")
    assert s.limit_bytes() == 2 * CACHE_STEP * BPT  # the weights leave a 2 steps of KV
    ok, too_big = Job(1, 500), Job(2, 600)
    s.enqueue(ok)
    assert admit_all(s) == [(1, Verdict.ADMIT)]
    account.set_kv("a", s.reserved_bytes())
    s.ended(1)
    account.set_kv("a", 0)
    s.enqueue(too_big)  # 768 positions: room for 512 beside the weights, and no KV to wait for
    assert admit_all(s) == [(2, Verdict.REFUSE)]
    assert "max_model_memory" in s.refusal(too_big, 500, 100)
    account.set_kv("b", CACHE_STEP * BPT)  # b's running requests will free theirs: wait
    s.enqueue(Job(3, 600))
    assert admit_all(s) == []


def test_window_and_state_layers_cost_what_they_hold():
    cost = KVCost(per_token=10, window_per_token=20, window=32, fixed=1000)
    budget = KVBudget(limit_bytes=10**9, bytes_per_token=10, cost=cost)
    short = budget.batch_bytes([100])  # 256 positions after rounding: all within a window + chunk
    assert short == 256 * 10 + 256 * 20 + 1000
    long = budget.batch_bytes([1000])  # 1024 positions: the sliding layers keep 32 + a chunk
    assert long == 1024 * 10 + (32 + CACHE_STEP) * 20 + 1000
    assert budget.batch_bytes([100, 1000]) == 2 * long
    assert budget.token_capacity % CACHE_STEP == 0
