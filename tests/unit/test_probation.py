"""The hot tier's probation for blocks read back from disk: rotating conversations find some
of their prefix in RAM where LRU and the reuse levels alone find none (issue 38)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.eviction import LRUPolicy
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import namespace_digest
from omlx.domain.cache.ports import EvictionPolicy
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.cache.probation import ProbationPolicy
from omlx.domain.cache.reuse_eviction import ReuseLevelPolicy
from tests.fakes import FakeClock, FakeCodec, FakeColdSource

BS = 4  # tokens per block; FakeCodec: 8 bytes a position, 32 a block
BLOCK = 8 * BS
CONVERSATIONS, TURNS = 12, 8
SYSTEM, REPLY, NEXT = 40 * BS, 3 * BS, 5 * BS  # a turn adds its reply and the next message
TIER_SHARE = 7  # the tier holds 1/7 of the conversations' final working set

Order = Callable[[random.Random], Iterator[int]]


def round_robin(_: random.Random) -> Iterator[int]:
    for _turn in range(TURNS):
        yield from range(CONVERSATIONS)


def skewed(rng: random.Random) -> Iterator[int]:
    """As many requests, three conversations six times busier than the other nine."""
    weights = [6 if c < 3 else 1 for c in range(CONVERSATIONS)]
    for _ in range(CONVERSATIONS * TURNS):
        yield rng.choices(range(CONVERSATIONS), weights)[0]


def replay(policy: EvictionPolicy, order: Order) -> tuple[int, int, int]:
    """Conversations of growing prefixes through the real prefix cache over a cold tier that
    keeps everything: (whole blocks restored from RAM, from disk, RAM evictions)."""
    rng = random.Random(7)
    digest = namespace_digest({"model": "fake-rotating", "block_size": BS})
    final_tokens = SYSTEM + TURNS * (REPLY + NEXT)
    hot = HotTier(CONVERSATIONS * final_tokens // BS * BLOCK // TIER_SHARE, policy)
    cache = PrefixCache(
        namespace=NamespaceInfo(digest, "fake", "/models/fake", BS, "float16", 2),
        codec=FakeCodec(),
        hot=hot,
        cold=FakeColdSource(),
        clock=FakeClock(),
    )

    def text(n: int) -> list[int]:
        return [rng.randrange(1, 50_000) for _ in range(n)]

    prompts = [text(SYSTEM) for _ in range(CONVERSATIONS)]
    from_ram = from_disk = 0
    for c in order(rng):
        prompt, reply = prompts[c], text(REPLY)
        session = cache.begin(prompt)
        assert (session.restore() or []) == prompt[: session.cached_tokens]
        from_ram += session.hit.hot_hits
        from_disk += session.hit.cold_hits
        full = [*prompt, *reply]
        session.finished(full, list(full))
        prompts[c] = [*full, *text(NEXT)]
    stats = hot.stats()
    assert stats.bytes <= stats.max_bytes and stats.pinned == 0
    return from_ram, from_disk, stats.evictions


POLICIES = {"lru": LRUPolicy, "reuse levels": ReuseLevelPolicy, "probation": ProbationPolicy}


def test_round_robin_conversations_restore_from_ram_where_lru_and_reuse_levels_do_not() -> None:
    results = {name: replay(make(), round_robin) for name, make in POLICIES.items()}
    # Every policy restores the same blocks (the disk holds them all); where from differs.
    assert len({ram + disk for ram, disk, _ in results.values()}) == 1
    share = {name: ram / (ram + disk) for name, (ram, disk, _) in results.items()}
    assert share["lru"] == 0 and share["reuse levels"] == 0  # each restore flushes the next
    assert share["probation"] >= 0.10
    # Blocks read back once are no longer copied into RAM only to be flushed again.
    assert results["probation"][2] < results["lru"][2] / 2


def test_a_skewed_mix_keeps_more_of_the_busy_conversations_than_either() -> None:
    results = {name: replay(make(), skewed) for name, make in POLICIES.items()}
    assert len({ram + disk for ram, disk, _ in results.values()}) == 1
    share = {name: ram / (ram + disk) for name, (ram, disk, _) in results.items()}
    assert share["probation"] >= 0.10
    assert share["probation"] > share["reuse levels"] > share["lru"]


# ---- the policy, block by block --------------------------------------------------


def never(_: str) -> bool:
    return False


def put(hot: HotTier, key: str, parent: str = "root", *, read_back: bool = False) -> bool:
    meta = BlockMeta(key=key, parent_key=parent, namespace="ns", token_count=BS)
    return hot.put(meta, (), key, 10, reused=read_back)


def test_it_is_an_eviction_policy() -> None:
    policy: EvictionPolicy = ProbationPolicy()
    assert policy.choose_victims(10, never) == []
    assert policy.promotion_victims("k", 10, never) is None  # nothing to make room of


def test_a_block_read_back_into_free_room_waits_on_probation_until_matched_again() -> None:
    policy = ProbationPolicy()
    hot = HotTier(10 * 4, policy)
    assert put(hot, "r", read_back=True)
    assert policy.is_candidate("r")
    assert hot.get("r") is not None  # a later request matches it in RAM
    assert not policy.is_candidate("r") and "r" in policy


def test_a_block_read_back_into_a_full_tier_displaces_no_resident_until_read_back_again() -> None:
    policy = ProbationPolicy()
    hot = HotTier(10 * 3, policy)
    for key in ("a", "b", "c"):
        put(hot, key)
        hot.get(key)  # matched: residents of the main segment
    assert not put(hot, "r", read_back=True)  # declined: the request uses what it read
    assert set(hot.keys()) == {"a", "b", "c"} and policy.remembers("r")
    assert put(hot, "r", read_back=True)  # it recurred while remembered: it enters
    assert "r" in hot and not policy.is_candidate("r") and len(hot) == 3


def test_a_block_pinned_already_enters_a_full_tier_when_read_back() -> None:
    policy = ProbationPolicy()
    hot = HotTier(10 * 2, policy)
    for key in ("a", "b"):
        put(hot, key)
        hot.get(key)
    hot.pin(["pinned"])  # a pinned prefix's block, on disk only
    assert put(hot, "pinned", read_back=True)
    assert "pinned" in hot and len(hot) == 2


def test_a_read_back_block_takes_the_room_of_other_candidates_oldest_first() -> None:
    policy = ProbationPolicy()
    hot = HotTier(10 * 3, policy)
    put(hot, "a")
    hot.get("a")
    put(hot, "old", read_back=True)
    put(hot, "new", read_back=True)
    assert put(hot, "r", read_back=True)
    assert set(hot.keys()) == {"a", "new", "r"} and policy.remembers("old")


def test_victims_are_one_off_blocks_then_candidates_oldest_first_then_the_main_segment() -> None:
    policy = ProbationPolicy()
    policy.record_insert("reused", 10, None)
    policy.record_hit("reused", 10)
    policy.record_promotion("cand1", 10, None)
    policy.record_promotion("cand2", 10, None)
    policy.record_insert("one-off", 10, None)  # newest, never matched
    assert policy.choose_victims(40, never) == ["one-off", "cand1", "cand2", "reused"]
    assert policy.choose_victims(20, lambda k: k == "cand1") == ["one-off", "cand2"]
    assert len(policy) == 4  # choosing removes nothing
    policy.remove("cand1")  # evicted unused: remembered
    policy.remove("reused")
    policy.remove("missing")
    assert policy.remembers("cand1") and not policy.remembers("reused")
    assert policy.choose_victims(100, never) == ["one-off", "cand2"]


def test_a_candidate_that_left_unused_enters_the_main_segment_when_read_back_again() -> None:
    policy = ProbationPolicy()
    policy.record_insert("head", 10, None)
    policy.record_hit("head", 10)
    policy.record_promotion("tail", 10, "head")
    policy.remove("tail")
    policy.record_promotion("tail", 10, "head")
    assert not policy.is_candidate("tail") and not policy.remembers("tail")
    # In the main segment at its reused parent's level: behind a one-off block.
    policy.record_insert("one-off", 10, None)
    assert policy.choose_victims(10, never) == ["one-off"]


def test_the_ghost_list_is_bounded_by_the_blocks_held() -> None:
    policy = ProbationPolicy(ghost_share=0.5)
    for i in range(8):
        policy.record_insert(f"held{i}", 10, None)
    for i in range(10):
        assert policy.promotion_victims(f"r{i}", 10, never) is None
    remembered = [i for i in range(10) if policy.remembers(f"r{i}")]
    assert remembered == [6, 7, 8, 9]  # the latest, half as many as the blocks held


@pytest.mark.parametrize("make", [LRUPolicy, ReuseLevelPolicy])
def test_the_other_policies_let_every_block_read_back_in(make: type) -> None:
    policy = make()
    policy.record_insert("a", 10, None)
    assert policy.promotion_victims("r", 10, never) == ["a"]


def test_a_declined_blocks_payload_serves_its_request_and_is_let_go_after_the_restore() -> None:
    digest = namespace_digest({"model": "fake-declined", "block_size": BS})
    cold = FakeColdSource()

    def prefix_cache(hot: HotTier) -> PrefixCache:
        return PrefixCache(
            namespace=NamespaceInfo(digest, "fake", "/models/fake", BS, "float16", 2),
            codec=FakeCodec(),
            hot=hot,
            cold=cold,
            clock=FakeClock(),
        )

    earlier = list(range(1, 3 * BS + 1))
    prefix_cache(HotTier(1 << 20)).store(earlier, earlier)  # on disk, as a restart leaves it
    cache = prefix_cache(HotTier(BLOCK * 3, ProbationPolicy()))
    other = list(range(1000, 1000 + 3 * BS))
    for _ in range(2):  # another conversation, matched again: the tier's residents
        session = cache.begin([*other, 1])
        session.restore()
        session.finished(other, list(other))
    residents = set(cache.hot.keys())
    session = cache.begin([*earlier, 9])
    assert session.hit.cold_hits == 3 and len(session.hit.payloads) == 3
    assert session.restore() == earlier  # served from what it read
    assert session.hit.payloads == () and session.cached_tokens == len(earlier)
    assert set(cache.hot.keys()) == residents
    session.close()
    assert cache.stats().hot.pinned == 0
