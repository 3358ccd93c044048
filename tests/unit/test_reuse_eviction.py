"""The hot tier's reuse-level policy: one-off blocks first out, the main session kept
(and by ``ProbationPolicy``, whose main segment it orders)."""

from __future__ import annotations

import pytest

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.eviction import LRUPolicy
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.ports import EvictionPolicy
from omlx.domain.cache.probation import ProbationPolicy
from omlx.domain.cache.reuse_eviction import ReuseLevelPolicy

ROOT = "namespace"


def never(_: str) -> bool:
    return False


class Agent:
    """Requests as the prefix cache makes them: match the chain in RAM, then store the rest."""

    def __init__(self, hot: HotTier) -> None:
        self.hot = hot

    def request(self, chain: list[str]) -> int:
        """One request over ``chain`` (block keys, head first); how many blocks it found in RAM."""
        found = 0
        for key in chain:
            if self.hot.get(key) is None:
                break
            found += 1
        parent = chain[found - 1] if found else ROOT
        for key in chain[found:]:
            self.hot.put(
                BlockMeta(key=key, parent_key=parent, namespace="ns", token_count=64), (), key, 10
            )
            parent = key
        return found


def session(name: str, blocks: int) -> list[str]:
    return [f"{name}{i}" for i in range(blocks)]


def test_it_is_an_eviction_policy() -> None:
    policy: EvictionPolicy = ReuseLevelPolicy()
    assert policy.choose_victims(10, never) == []


def test_one_off_blocks_leave_before_a_reused_conversation_even_when_newer() -> None:
    policy = ReuseLevelPolicy()
    for key in ("a", "b"):
        policy.record_insert(key, 10, None)
    policy.record_hit("a", 10)
    policy.record_hit("b", 10)
    for key in ("side0", "side1"):
        policy.record_insert(key, 10, None)  # newer, never matched again
    assert policy.choose_victims(20, never) == ["side0", "side1"]
    assert policy.choose_victims(30, never) == ["side0", "side1", "a"]


def test_a_new_block_inherits_its_parents_level_and_hits_raise_it_to_a_cap() -> None:
    policy = ReuseLevelPolicy(max_level=2)
    policy.record_insert("head", 10, None)
    assert policy.level("head") == 0
    for _ in range(5):
        policy.record_hit("head", 10)
    assert policy.level("head") == 2
    policy.record_insert("tail", 10, "head")  # the conversation's new turn
    policy.record_insert("fresh", 10, "unknown-parent")
    assert (policy.level("tail"), policy.level("fresh")) == (2, 0)
    policy.record_access("tail", 10)  # recency only
    assert policy.level("tail") == 2


def test_a_conversation_unused_for_several_turnovers_leaves_before_a_fresh_one() -> None:
    policy = ReuseLevelPolicy(stale_turnovers=1)
    policy.record_insert("old", 10, None)
    policy.record_hit("old", 10)
    policy.record_hit("old", 10)  # level 2, then left alone
    policy.record_insert("new", 10, None)
    policy.record_hit("new", 10)  # level 1 but fresh
    for i in range(4):
        policy.record_access("new", 10)
        policy.record_insert(f"x{i}", 10, None)
    assert policy.choose_victims(50, never)[:5] == ["x0", "x1", "x2", "x3", "old"]


def test_pinned_keys_are_skipped_choosing_mutates_nothing_and_remove_forgets() -> None:
    policy = ReuseLevelPolicy()
    for key in "abc":
        policy.record_insert(key, 10, None)
    policy.record_hit("c", 10)
    assert policy.choose_victims(10, lambda k: k == "a") == ["b"]
    assert policy.choose_victims(1000, lambda k: k == "b") == ["a", "c"]
    assert len(policy) == 3
    policy.remove("a")
    policy.remove("missing")
    assert "a" not in policy and policy.choose_victims(1000, never) == ["b", "c"]


def _agent_session(policy: EvictionPolicy) -> tuple[HotTier, list[int], list[str]]:
    """A main session of 5 turns, a 3-turn sub-agent and side calls, in a budget that holds
    the main session and its largest other request (11 + 6 blocks) but not everything."""
    hot = HotTier(10 * 17, policy)
    agent = Agent(hot)
    main = session("m", 8)  # grows 8 -> 12 blocks
    found = []
    for _ in range(4):
        found.append(agent.request(main))
        main.append(f"m{len(main)}")
    agent.request(session("title", 2))
    sub = session("sub", 4)  # grows 4 -> 6 blocks
    for _ in range(3):
        agent.request(sub)
        sub.append(f"sub{len(sub)}")
    for name in ("summary", "safety", "topic"):
        agent.request(session(name, 2))
    found.append(agent.request(main))
    return hot, found, main


@pytest.mark.parametrize("make", [ReuseLevelPolicy, ProbationPolicy])
def test_the_main_session_survives_a_sub_agent_and_side_calls_within_budget(make: type) -> None:
    hot, found, main = _agent_session(make())
    assert found == [0, 8, 9, 10, 11]  # every turn finds all its previous turn held
    assert set(main) <= set(hot.keys())
    assert hot.stats().bytes <= hot.max_bytes


def test_plain_lru_loses_the_main_session_to_the_same_sequence() -> None:
    _, found, _ = _agent_session(LRUPolicy())
    assert found[-1] < 11  # the contrast the policy exists for


@pytest.mark.parametrize("make", [ReuseLevelPolicy, ProbationPolicy])
def test_a_block_read_back_from_disk_for_a_match_counts_as_reused(make: type) -> None:
    hot = HotTier(10 * 4, make())
    for key, parent in (("m0", ROOT), ("m1", "m0")):  # the main session, promoted after a restart
        hot.put(
            BlockMeta(key=key, parent_key=parent, namespace="ns", token_count=64),
            (),
            key,
            10,
            reused=True,
        )
    Agent(hot).request(session("side", 3))  # a side call needs room
    assert {"m0", "m1"} <= set(hot.keys())


def test_a_chain_read_back_from_disk_does_not_climb_a_level_per_block() -> None:
    policy = ReuseLevelPolicy()
    parent = None
    for i in range(5):
        policy.record_promotion(f"b{i}", 10, parent)
        parent = f"b{i}"
    assert {policy.level(f"b{i}") for i in range(5)} == {1}
