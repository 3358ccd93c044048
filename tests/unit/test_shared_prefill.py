"""Who waits for whose prefill (``domain.shared_prefill``), over plain chain keys and steps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from omlx.domain.cache.keys import chain_keys
from omlx.domain.shared_prefill import Prefilling, SharedPrefill, Wait, shared_blocks

BS, STEP = 4, 8  # two blocks per prefill step
ROOT = "ab" * 32


def keys(*parts: list[int]) -> list[str]:
    return chain_keys(ROOT, [t for part in parts for t in part], BS)


PREFIX = list(range(100, 164))  # 16 blocks
A = keys(PREFIX, [1] * 8)  # 18 blocks
B = keys(PREFIX, [2] * 8)


class Cache:
    """What the prefix cache holds of a prompt's first keys; counts the questions."""

    def __init__(self, held: int = 0) -> None:
        self.held, self.asked = held, 0

    def __call__(self, ks) -> int:
        self.asked += 1
        return min(self.held, len(ks))


@given(
    st.lists(st.integers(0, 5), max_size=40),
    st.lists(st.integers(0, 5), max_size=40),
)
def test_shared_blocks_is_the_common_whole_blocks_of_the_tokens(a, b):
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    whole = min(common, len(a) // BS * BS, len(b) // BS * BS) // BS
    assert shared_blocks(keys(a), keys(b)) == whole


def test_a_request_waits_for_a_leader_computing_its_prefix_then_goes():
    room, cache = SharedPrefill(BS, STEP), Cache()
    wait = room.wait(2, B, [Prefilling(1, A, kept=0)], cache, step=0)
    assert wait == Wait(leader=1, blocks=16, cached=0) and wait.in_flight == 16
    for step in range(1, 8):  # the leader keeps a step's two blocks each step
        assert room.still_waiting(2, {1: 2 * BS * step}, step)
    assert not room.still_waiting(2, {1: 16 * BS}, 8)  # it kept the shared blocks
    cache.held = 16
    assert room.wait(2, B, [Prefilling(1, A, kept=16 * BS)], cache, step=8) is None
    assert 2 not in room


def test_nothing_to_wait_for_goes_at_once_without_asking_the_cache():
    room, cache = SharedPrefill(BS, STEP), Cache()
    other = keys([7] * 64)
    assert room.wait(2, B, [], cache, 0) is None
    assert room.wait(2, B, [Prefilling(1, other, kept=0)], cache, 0) is None
    assert cache.asked == 0
    # A leader that already kept the shared blocks: they are restored, not waited for.
    assert room.wait(2, B, [Prefilling(1, A, kept=17 * BS)], cache, 0) is None
    assert cache.asked == 0 and 2 not in room


def test_no_wait_for_what_the_cache_holds_or_for_a_leader_slower_than_computing():
    room = SharedPrefill(BS, STEP)
    # The cache holds the whole shared prefix already (the leader restored it).
    assert room.wait(2, B, [Prefilling(1, A, kept=0)], Cache(16), 0) is None
    # It holds 14 of 16: one step computes the last two, the leader needs eight.
    assert room.wait(2, B, [Prefilling(1, A, kept=0)], Cache(14), 0) is None
    # The same leader at block 14 is as fast as computing: worth the wait.
    assert room.wait(2, B, [Prefilling(1, A, kept=14 * BS)], Cache(14), 0) == Wait(1, 16, 14)


def test_the_leader_sharing_most_wins_then_the_furthest_along():
    room = SharedPrefill(BS, STEP)
    short = keys(PREFIX[:32], [9] * 40)  # shares 8 blocks
    leaders = [
        Prefilling(1, short, kept=6 * BS),
        Prefilling(3, A, kept=2 * BS),
        Prefilling(4, A, kept=4 * BS),
    ]
    assert room.wait(2, B, leaders, Cache(), 0) == Wait(4, 16, 0)


def test_a_stalled_leader_is_given_up_and_not_chosen_again():
    room = SharedPrefill(BS, STEP, patience=3)
    leader = [Prefilling(1, A, kept=4 * BS)]
    assert room.wait(2, B, leader, Cache(), 0)
    assert room.still_waiting(2, {1: 4 * BS}, 1)
    assert room.still_waiting(2, {1: 4 * BS}, 2)
    assert not room.still_waiting(2, {1: 4 * BS}, 3)  # three steps without a block kept
    assert room.wait(2, B, leader, Cache(), 3) is None
    assert 2 not in room


def test_a_slow_leader_is_given_up_once_computing_would_have_been_done():
    room = SharedPrefill(BS, STEP, patience=2)
    assert room.wait(2, B, [Prefilling(1, A, kept=0)], Cache(), 0)  # computing: 8 steps
    kept = 0
    for step in range(1, 11):  # one block a step, half the speed expected: still moving
        kept += BS
        assert room.still_waiting(2, {1: kept}, step)
    assert not room.still_waiting(2, {1: kept + BS}, 11)  # past 8 steps and the slack of 2
    assert room.wait(2, B, [Prefilling(1, A, kept=kept + BS)], Cache(11), 11) is None


def test_a_leader_that_leaves_ends_the_wait_and_another_may_be_chosen():
    room = SharedPrefill(BS, STEP)
    assert room.wait(2, B, [Prefilling(1, A, kept=0)], Cache(), 0) == Wait(1, 16, 0)
    assert not room.still_waiting(2, {}, 1)  # cancelled: no longer running
    # Its kept blocks are in the cache; a third request covers more of the prompt.
    third = Prefilling(3, keys(PREFIX, [2] * 8, [5] * 8), kept=6 * BS)
    assert room.wait(2, B, [third], Cache(4), 1) == Wait(3, 18, 4)
    room.forget(2)
    assert 2 not in room and room.waiting_for(2) is None


def test_the_step_is_counted_in_whole_blocks():
    # A step of 10 tokens over blocks of 4 runs chunks of 8 (``admission.segments``).
    room = SharedPrefill(BS, 10)
    assert room.step_size == 8
    assert SharedPrefill(16, 8).step_size == 16
