"""The LRU policy and the cold tier's victim planner."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from omlx.domain.cache.blocks import StoredBlock
from omlx.domain.cache.eviction import LRUPolicy, plan_eviction
from omlx.domain.cache.ports import EvictionPolicy


def never(_: str) -> bool:
    return False


def stored(key: str, nbytes: int, at: float = 0.0) -> StoredBlock:
    return StoredBlock(key, "ns", "parent", 4, nbytes, "sum", f"x/{key}", at, at)


def test_lru_policy_is_an_eviction_policy() -> None:
    policy: EvictionPolicy = LRUPolicy()
    assert policy.choose_victims(10, never) == []


def test_victims_are_least_recently_used_first() -> None:
    policy = LRUPolicy()
    for key in "abcd":
        policy.record_access(key, 10)
    policy.record_access("a", 10)  # a is now the youngest
    assert policy.choose_victims(25, never) == ["b", "c", "d"]
    assert policy.choose_victims(10, never) == ["b"]
    assert policy.choose_victims(0, never) == []


def test_pinned_keys_are_skipped_and_short_budgets_return_every_unpinned_key() -> None:
    policy = LRUPolicy()
    for key in "abc":
        policy.record_access(key, 10)
    assert policy.choose_victims(10, lambda k: k == "a") == ["b"]
    assert policy.choose_victims(1000, lambda k: k == "b") == ["a", "c"]


def test_remove_forgets_and_choose_does_not_mutate() -> None:
    policy = LRUPolicy()
    policy.record_access("a", 5)
    policy.record_access("b", 5)
    policy.choose_victims(100, never)
    assert len(policy) == 2
    policy.remove("a")
    policy.remove("missing")
    assert "a" not in policy
    assert policy.choose_victims(100, never) == ["b"]


def test_record_access_updates_the_size() -> None:
    policy = LRUPolicy()
    policy.record_access("a", 5)
    policy.record_access("b", 5)
    policy.record_access("a", 50)
    assert policy.choose_victims(6, never) == ["b", "a"]


def test_plan_eviction_takes_oldest_until_within_budget() -> None:
    blocks = [stored(k, 10, i) for i, k in enumerate("abcde")]
    assert [b.key for b in plan_eviction(blocks, 50, 30, never)] == ["a", "b"]
    assert [b.key for b in plan_eviction(blocks, 50, 25, never)] == ["a", "b", "c"]
    assert plan_eviction(blocks, 50, 50, never) == []


def test_plan_eviction_never_chooses_pinned_blocks() -> None:
    blocks = [stored(k, 10, i) for i, k in enumerate("abc")]
    plan = plan_eviction(blocks, 30, 0, lambda k: k == "b")
    assert [b.key for b in plan] == ["a", "c"]


def test_plan_eviction_reads_lazily() -> None:
    read: list[str] = []

    def pages():
        for i, key in enumerate("abcdef"):
            read.append(key)
            yield stored(key, 10, i)

    plan_eviction(pages(), 60, 40, never)
    assert read == ["a", "b", "c"]


@given(
    st.lists(st.tuples(st.integers(1, 100), st.booleans()), max_size=30),
    st.integers(0, 3000),
)
def test_plan_eviction_meets_the_budget_when_it_can(
    spec: list[tuple[int, bool]], max_bytes: int
) -> None:
    blocks = [stored(f"k{i}", n, i) for i, (n, _) in enumerate(spec)]
    pinned = {f"k{i}" for i, (_, p) in enumerate(spec) if p}
    total = sum(b.nbytes for b in blocks)
    plan = plan_eviction(blocks, total, max_bytes, pinned.__contains__)
    freed = sum(b.nbytes for b in plan)
    assert not {b.key for b in plan} & pinned
    unpinned = total - sum(b.nbytes for b in blocks if b.key in pinned)
    if total - unpinned <= max_bytes:
        assert total - freed <= max_bytes
    # Minimal: without its last victim the plan would not have been enough.
    if plan:
        assert total - (freed - plan[-1].nbytes) > max_bytes
