"""The hot tier: budget, LRU order, pins, shrink, stats."""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.hot_tier import HotTier


def parent_of(key: str) -> str:
    """Keys share three parents, so the parent -> children map has siblings to track."""
    return f"p{sum(map(ord, key)) % 3}"


def meta(key: str) -> BlockMeta:
    return BlockMeta(key=key, parent_key=parent_of(key), namespace="ns", token_count=4)


def put(hot: HotTier, key: str, nbytes: int = 10) -> bool:
    return hot.put(meta(key), (1, 2, 3, 4), f"payload-{key}", nbytes)


def test_put_and_get() -> None:
    hot = HotTier(100)
    assert put(hot, "a")
    block = hot.get("a")
    assert block is not None and block.payload == "payload-a" and block.key == "a"
    assert block.tokens == (1, 2, 3, 4) and block.nbytes == 10
    assert hot.get("b") is None
    s = hot.stats()
    assert (s.blocks, s.bytes, s.max_bytes, s.hits, s.misses, s.evictions) == (1, 10, 100, 1, 1, 0)


def test_eviction_takes_the_least_recently_used() -> None:
    hot = HotTier(30)
    for key in "abc":
        put(hot, key)
    hot.get("a")  # b is now the oldest
    assert put(hot, "d")
    assert "b" not in hot and {"a", "c", "d"} <= set(hot.keys())
    hot.touch("c")
    assert put(hot, "e")
    assert set(hot.keys()) == {"c", "d", "e"}
    assert hot.stats().evictions == 2


def test_a_big_block_evicts_as_many_as_it_needs() -> None:
    hot = HotTier(40)
    for key in "abcd":
        put(hot, key)
    assert put(hot, "big", 25)
    assert set(hot.keys()) == {"d", "big"}
    assert hot.stats().bytes == 35


def test_pinned_blocks_are_never_evicted() -> None:
    hot = HotTier(30)
    for key in "abc":
        put(hot, key)
    hot.pin(["a", "b"])
    assert put(hot, "d")
    assert set(hot.keys()) == {"a", "b", "d"}
    assert hot.shrink(0) == 10
    assert set(hot.keys()) == {"a", "b"}


def test_a_block_that_cannot_fit_is_refused_without_evicting() -> None:
    hot = HotTier(30)
    for key in "abc":
        put(hot, key)
    hot.pin(["a", "b"])
    assert not put(hot, "big", 25)  # only c (10 bytes) could go
    assert set(hot.keys()) == {"a", "b", "c"}
    assert not put(hot, "huge", 31)
    assert hot.stats().evictions == 0


def test_pins_are_counted() -> None:
    hot = HotTier(10)
    put(hot, "a")
    hot.pin(["a"])
    hot.pin(["a"])
    hot.unpin(["a"])
    assert hot.is_pinned("a")
    assert not put(hot, "b")
    hot.unpin(["a"])
    assert not hot.is_pinned("a")
    hot.unpin(["a"])  # extra unpins are ignored
    assert put(hot, "b") and "a" not in hot


def test_a_pin_outlives_presence() -> None:
    # Pins are per key, so a block promoted after pinning (or one the cold tier holds) is protected.
    hot = HotTier(10)
    hot.pin(["a"])
    put(hot, "a")
    assert not put(hot, "b")
    assert hot.stats().pinned == 1


def test_put_of_a_present_key_only_touches() -> None:
    hot = HotTier(20)
    put(hot, "a")
    put(hot, "b")
    assert hot.put(meta("a"), (9,), "other", 10)
    assert hot.get("a").payload == "payload-a"  # type: ignore[union-attr]
    put(hot, "c")
    assert "b" not in hot


def test_shrink_and_clear() -> None:
    hot = HotTier(100)
    for key in "abcde":
        put(hot, key)
    assert hot.shrink(25) == 30
    assert set(hot.keys()) == {"d", "e"}
    assert hot.shrink(100) == 0
    hot.pin(["d"])
    hot.clear()
    s = hot.stats()
    assert (s.blocks, s.bytes, s.evictions) == (0, 0, 3)
    assert hot.is_pinned("d")


def test_children_follow_puts_evictions_and_clear() -> None:
    hot = HotTier(30)
    for key in "abc":
        put(hot, key)
    by_parent = {p: {k for k in "abc" if parent_of(k) == p} for p in ("p0", "p1", "p2")}
    for parent, keys in by_parent.items():
        assert {b.key for b in hot.children(parent)} == keys
    stats = hot.stats()
    put(hot, "d")  # evicts a, the oldest
    assert "a" not in {b.key for b in hot.children(parent_of("a"))}
    assert "d" in {b.key for b in hot.children(parent_of("d"))}
    assert (hot.stats().hits, hot.stats().misses) == (stats.hits, stats.misses)  # no hit counted
    hot.clear()
    assert all(hot.children(p) == [] for p in ("p0", "p1", "p2"))
    assert hot.children("unknown") == []


def test_invalid_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        HotTier(-1)
    with pytest.raises(ValueError):
        put(HotTier(10), "a", -1)


def test_stats_can_be_read_while_the_engine_thread_writes() -> None:
    hot = HotTier(500)
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            s = hot.stats()
            assert s.bytes <= s.max_bytes
            seen.append(s.bytes)

    t = threading.Thread(target=reader)
    t.start()
    for i in range(3000):
        put(hot, f"k{i}", 7 + i % 13)
    stop.set()
    t.join()
    assert seen and hot.stats().bytes <= 500


class HotTierMachine(RuleBasedStateMachine):
    """A random workload against a plain reference model of LRU with pins."""

    KEYS_ALL = tuple(f"k{i}" for i in range(12))
    KEYS = st.sampled_from(KEYS_ALL)

    def __init__(self) -> None:
        super().__init__()
        self.max_bytes = 100
        self.hot = HotTier(self.max_bytes)
        self.order: OrderedDict[str, int] = OrderedDict()  # oldest first
        self.pins: Counter[str] = Counter()

    def _evict_plan(self, needed: int) -> list[str] | None:
        plan, freed = [], 0
        for key, n in self.order.items():
            if freed >= needed:
                break
            if self.pins[key] == 0:
                plan.append(key)
                freed += n
        return plan if freed >= needed else None

    @rule(key=KEYS, nbytes=st.integers(0, 60))
    def put(self, key: str, nbytes: int) -> None:
        ok = put(self.hot, key, nbytes)
        if key in self.order:
            self.order.move_to_end(key)
            assert ok
            return
        plan = self._evict_plan(sum(self.order.values()) + nbytes - self.max_bytes)
        if nbytes > self.max_bytes or plan is None:
            assert not ok
            return
        assert ok
        for victim in plan:
            del self.order[victim]
        self.order[key] = nbytes

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        block = self.hot.get(key)
        assert (block is not None) == (key in self.order)
        if block is not None:
            self.order.move_to_end(key)

    @rule(key=KEYS)
    def pin(self, key: str) -> None:
        self.hot.pin([key])
        self.pins[key] += 1

    @precondition(lambda self: +self.pins)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(+self.pins)))
        self.hot.unpin([key])
        self.pins[key] -= 1

    @rule(target_bytes=st.integers(0, 100))
    def shrink(self, target_bytes: int) -> None:
        pinned_before = {k for k in self.order if self.pins[k]}
        self.hot.shrink(target_bytes)
        needed = sum(self.order.values()) - target_bytes
        plan = [] if needed <= 0 else self._evict_plan(needed)
        if plan is None:  # not enough unpinned: every unpinned block goes
            plan = [k for k in self.order if self.pins[k] == 0]
        for victim in plan:
            del self.order[victim]
        assert pinned_before <= set(self.hot.keys())

    @invariant()
    def matches_the_model(self) -> None:
        s = self.hot.stats()
        assert s.bytes <= s.max_bytes
        assert set(self.hot.keys()) == set(self.order)
        assert s.bytes == sum(self.order.values())
        assert s.pinned == len(+self.pins)
        for parent in {parent_of(k) for k in self.KEYS_ALL}:
            held = {b.key for b in self.hot.children(parent)}
            assert held == {k for k in self.order if parent_of(k) == parent}


TestHotTierMachine = HotTierMachine.TestCase
TestHotTierMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
