"""A request's ``CacheSession`` over fakes, driven as the engine drives it, without MLX.

begin -> restore -> prefilled after each chunk -> decoded while it generates -> finished
-> close, over ``FakeCodec`` (a cache is a list of token ids, one per position; a state
snapshot is ``("state", length, sum)``; a window object is ``("window", *positions)``),
so every restored object can be checked against the position it claims.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from omlx.domain.cache.blocks import NamespaceInfo
from omlx.domain.cache.cold_tier import ColdTier
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import namespace_digest
from omlx.domain.cache.layout import CacheLayout
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.cache.session import CacheSession
from tests.fakes import (
    FakeBlockIndex,
    FakeBlockSink,
    FakeBlockStore,
    FakeClock,
    FakeCodec,
    FakeKeptCaches,
)

BS, STEP, WINDOW = 8, 32, 12  # a window that is no multiple of the block size
HYBRID = CacheLayout(window=WINDOW, has_state=True)
PLAIN = CacheLayout()


def namespace() -> NamespaceInfo:
    digest = namespace_digest({"model": "fake-hybrid", "block_size": BS})
    return NamespaceInfo(digest, "fake", "/models/fake", BS, "float16", 2)


def make(layout: CacheLayout, **kwargs: object) -> PrefixCache:
    return PrefixCache(
        namespace=namespace(),
        codec=FakeCodec(),
        hot=HotTier(1 << 30),
        clock=FakeClock(),
        layout=layout,
        **kwargs,  # type: ignore[arg-type]
    )


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 1000) for _ in range(n)]


def chunk_ends(length: int, start: int, plan: Sequence[int]) -> list[int]:
    """Where the engine calls ``prefilled``: chunk and plan boundaries before the prompt's end."""
    cuts = set(range((start // STEP + 1) * STEP, length, STEP))
    cuts.update(p for p in plan if start < p < length)
    return sorted(cuts)


def serve(pc: PrefixCache, prompt: list[int], generated: Sequence[int] = ()) -> CacheSession:
    """One request as the engine runs it; its cache holds each position's token id."""
    session = pc.begin(prompt)
    restored = session.restore()
    cached = session.cached_tokens
    assert (restored or []) == prompt[:cached]  # a hit is the miss's prefix, to the token
    for end in chunk_ends(len(prompt), cached, session.plan):
        session.prefilled(lambda end=end: prompt[:end], end)
    full = [*prompt, *generated]
    for position in range(len(prompt) + 1, len(full) + 1):
        if session.wants_decoded(position):
            session.decoded(lambda position=position: full[:position], position)
    session.finished(full, list(full))
    session.close()
    return session


def expect_point(
    session: CacheSession, prompt: list[int], position: int, window: int | None = WINDOW
) -> None:
    """The session restores exactly ``position``, with the state and windows taken there."""
    hit = session.hit
    assert session.cached_tokens == position
    assert hit.state == ("state", position, sum(prompt[:position]))
    first = max(position - (window or 0), 0) // BS * BS  # the blocks covering [p - W, p)
    assert [v for w in hit.windows for v in w[1:]] == prompt[first:position]
    assert all(w[0] == "window" for w in hit.windows)
    assert session.restore() == prompt[:position]


def test_a_replay_restores_to_its_last_but_one_token_with_its_state_and_windows() -> None:
    pc = make(HYBRID)
    prompt = tokens(200, seed=1)
    first = serve(pc, prompt, generated=tokens(5, seed=9))
    assert first.cached_tokens == 0
    assert first.plan == (64, 128, 192, 199)  # the interior lattice, then the prompt's end
    replay = pc.begin(prompt)
    expect_point(replay, prompt, 199)
    replay.close()
    assert pc.stats().active_leases == 0 and pc.stats().hot.pinned == 0


def test_a_prompt_sharing_part_of_a_prefix_restores_at_the_deepest_interior_point() -> None:
    pc = make(HYBRID)
    stem = tokens(200, seed=2)
    serve(pc, stem)
    other = [*stem[:150], *tokens(30, seed=3)]
    session = pc.begin(other)
    expect_point(session, other, 128)  # the interior point below where they part
    assert session.lost_tokens == 150 - 128  # matched by KV, recomputed for want of a point
    session.close()


def test_the_branch_point_is_kept_so_the_next_request_on_that_branch_hits_there() -> None:
    pc = make(HYBRID)
    stem = tokens(200, seed=4)
    serve(pc, stem)
    branch = [*stem[:150], *tokens(40, seed=5)]
    second = serve(pc, branch)
    assert second.cached_tokens == 128 and 150 in second.plan  # where it left the prefix
    sibling = [*stem[:150], *tokens(40, seed=6)]
    third = pc.begin(sibling)
    expect_point(third, sibling, 150)
    assert third.lost_tokens == 0
    third.close()


def test_window_blocks_cut_during_decode_serve_a_restore_at_the_generation_end() -> None:
    pc = make(HYBRID)
    prompt, generated = tokens(70, seed=7), tokens(27, seed=8)  # decode completes 3 blocks
    serve(pc, prompt, generated)
    full = [*prompt, *generated]
    follow_up = [*full, *tokens(10, seed=10)]
    session = pc.begin(follow_up)
    expect_point(session, follow_up, len(full))  # its windows came from the decode ring
    session.close()


def test_a_plain_layout_stores_every_block_and_continues_a_kept_cache() -> None:
    kept = FakeKeptCaches()
    pc = make(PLAIN, kept=kept)
    prompt = tokens(100, seed=11)
    first = serve(pc, prompt, generated=tokens(6, seed=12))
    assert first.plan == ()  # every block boundary restores a plain layout
    assert pc.stats().stored_blocks == 106 // BS + 1  # full blocks and the partial one
    follow_up = [*prompt, *tokens(6, seed=12), *tokens(20, seed=13)]
    second = pc.begin(follow_up)
    assert second.restore() == follow_up[:106] and second.continued
    assert pc.stats().continued_requests == 1 and kept.taken == 1
    second.close()
    held = pc.held_bytes()
    assert pc.make_room(held) == held and kept.kept  # it fits: nothing goes
    assert pc.make_room(0) == 0 and kept.kept == []  # kept caches first, then the hot tier


def _two_kept_conversations() -> tuple[PrefixCache, FakeKeptCaches, list[int], CacheSession]:
    """Conversations A then B served (both kept), and A's next turn begun (not restored)."""
    kept = FakeKeptCaches()
    pc = make(PLAIN, kept=kept)
    a, b = tokens(100, seed=21), tokens(60, seed=22)
    serve(pc, a, generated=tokens(6, seed=23))
    serve(pc, b, generated=tokens(6, seed=24))
    follow_up = [*a, *tokens(6, seed=23), *tokens(20, seed=25)]
    return pc, kept, follow_up, pc.begin(follow_up)


def test_kept_caches_survive_a_request_while_memory_is_ample() -> None:
    pc, kept, follow_up, session = _two_kept_conversations()
    own = 8 * 106  # A's kept cache: it becomes the follow-up's own cache
    held = pc.held_bytes()
    assert session.kept_prefix() == follow_up[:106]
    assert pc.make_room(held, session) == held - own and len(kept.kept) == 2
    # Room for all but A's kept cache: still ample (the room asked for already counts it).
    assert pc.make_room(held - own, session) == held - own and len(kept.kept) == 2
    assert session.restore() == follow_up[:106] and session.continued
    session.close()


def test_short_memory_gives_back_other_kept_caches_then_the_hot_tier_not_the_continued() -> None:
    pc, kept, follow_up, session = _two_kept_conversations()
    own = 8 * 106  # A's kept cache
    hot = pc.stats().hot.bytes
    assert pc.make_room(hot, session) == hot  # B's kept cache goes, the hot tier stays
    assert [len(t) for t, _ in kept.kept] == [106] and pc.stats().hot.bytes == hot
    assert pc.held_bytes() == hot + own
    left = pc.make_room(hot // 2, session)  # more than B's: the hot tier gives back too
    assert [len(t) for t, _ in kept.kept] == [106]
    assert left == pc.stats().hot.bytes < hot
    in_ram = pc.hot.keys()
    assert all(pc.is_pinned(k) for k in in_ram)  # all it kept: A's prefix, pinned
    assert session.restore() == follow_up[:106] and session.continued
    session.close()
    assert pc.make_room(0) == 0 and kept.kept == []  # no request asking: every kept cache


def test_a_request_that_continues_no_kept_cache_spares_none() -> None:
    pc, kept, _, _ = _two_kept_conversations()
    stranger = pc.begin(tokens(50, seed=26))
    assert stranger.kept_prefix() == ()
    hot = pc.stats().hot.bytes
    assert pc.make_room(hot, stranger) == hot and kept.kept == []
    stranger.close()
    no_store = pc.begin(tokens(100, seed=21), store=False)  # A's prefix, but keeps nothing
    assert no_store.cached_tokens and no_store.kept_prefix() == ()
    no_store.close()


def test_a_failed_cut_stops_capturing_and_finishing_cuts_the_rest() -> None:
    # State only: a fresh capture at the finish has no decode ring to take window KV from.
    pc = make(CacheLayout(has_state=True))
    prompt = tokens(120, seed=14)
    session = pc.begin(prompt)
    session.restore()

    def broken() -> list[int]:
        raise RuntimeError("the batch moved under us")

    session.prefilled(broken, 32)  # logged, never raised into the engine
    session.prefilled(lambda: prompt[:64], 64)  # capturing has stopped: nothing happens
    assert pc.stats().stored_blocks == 0
    session.finished(prompt, list(prompt))
    assert pc.stats().stored_blocks == 120 // BS
    follow_up = [*prompt, *tokens(9, seed=16)]
    replay = pc.begin(follow_up)
    expect_point(replay, follow_up, len(prompt), window=None)  # the end point, cut at the finish
    replay.close()


@pytest.mark.parametrize("layout", [HYBRID, PLAIN], ids=["hybrid", "plain"])
def test_one_index_query_per_prefill_chunk(layout: CacheLayout) -> None:
    clock = FakeClock()
    store, index = FakeBlockStore(), FakeBlockIndex()
    writer = FakeBlockSink(store, index, clock)
    cold = ColdTier(
        namespace(), store, index, writer, FakeCodec().decode, clock=clock, check=FakeCodec().check
    )
    pc = make(layout, cold=cold)
    prompt = tokens(300, seed=15)
    session = pc.begin(prompt)
    session.restore()
    ends = chunk_ends(len(prompt), 0, session.plan)
    assert len(ends) >= 9  # each chunk completes several blocks (and objects, hybrid)
    for end in ends:
        before = index.lookups
        session.prefilled(lambda end=end: prompt[:end], end)
        assert index.lookups - before == 1, end
    writer.drain()  # on disk now: the finish asks once more, for its own new blocks
    before = index.lookups
    session.finished(prompt, list(prompt))
    assert index.lookups - before == 1
    restarted = make(layout, cold=cold)  # empty RAM, the same disk
    writer.drain()
    replay = restarted.begin(prompt)
    assert replay.cached_tokens == len(prompt) - 1 and replay.restore() == prompt[:-1]
    replay.close()
