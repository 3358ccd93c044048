"""The prefix cache over fakes: matching to the token, pins, cold promotion, write-through stores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import block_key, chain_keys, namespace_digest
from omlx.domain.cache.partial_match import common_prefix
from omlx.domain.cache.prefix_cache import PrefixCache
from tests.fakes import FakeClock, FakeCodec, FakeColdSource


def namespace(bs: int) -> NamespaceInfo:
    digest = namespace_digest({"model": "fake", "block_size": bs})
    return NamespaceInfo(digest, "fake", "/models/fake", bs, "float16", 2)


def make(
    bs: int = 16,
    hot_bytes: int = 1 << 30,
    cold: FakeColdSource | None = None,
    codec: FakeCodec | None = None,
    **kwargs: object,
) -> PrefixCache:
    hot = HotTier(hot_bytes)
    pc = PrefixCache(
        namespace=namespace(bs),
        codec=codec or FakeCodec(),
        hot=hot,
        cold=cold,
        clock=FakeClock(),
        **kwargs,  # type: ignore[arg-type]
    )
    assert pc.hot is hot
    return pc


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def serve(pc: PrefixCache, tokens: list[int]) -> int:
    """One request: look up, restore, 'compute' the rest, store, release; returns cached tokens."""
    hit_session = pc.begin(tokens)
    hit = hit_session.hit
    restored = hit_session.restore() or []
    assert restored == tokens[: hit.cached_tokens]
    pc.store(tokens, list(tokens))  # the fake cache holds each position's token id
    hit_session.close()
    return hit.cached_tokens


def all_keys(namespace_digest: str, tokens: list[int], bs: int) -> list[str]:
    """The keys ``store`` gives ``tokens``: every full block, then the partial one, if any."""
    keys = chain_keys(namespace_digest, tokens, bs)
    start = len(keys) * bs
    if start < len(tokens):
        keys.append(block_key(keys[-1] if keys else namespace_digest, tokens[start:]))
    return keys


def best_prefix(query: list[int], stored: list[list[int]]) -> int:
    """What a token-exact cache restores: the longest common prefix, one token left over."""
    return min(max((common_prefix(query, s) for s in stored), default=0), max(len(query) - 1, 0))


# (block size, a shared stem, conversations = stem[:cut] + their own tail)
conversations = st.tuples(
    st.sampled_from([4, 16, 64]),
    st.lists(st.integers(0, 50_000), max_size=300),
    st.lists(
        st.tuples(st.integers(0, 300), st.lists(st.integers(0, 50_000), max_size=80)),
        min_size=1,
        max_size=5,
    ),
)


@settings(max_examples=60, deadline=None)
@given(conversations, st.integers(0, 300), st.lists(st.integers(0, 50_000), max_size=80))
def test_lookup_finds_the_longest_leading_run(
    conv: tuple[int, list[int], list[tuple[int, list[int]]]], cut: int, tail: list[int]
) -> None:
    bs, stem, branches = conv
    stored = [stem[:c] + t for c, t in branches]
    pc = make(bs)
    for tokens in stored:
        pc.store(tokens, list(tokens))
    query = stem[:cut] + tail
    hit_session = pc.begin(query)
    hit = hit_session.hit
    expected = best_prefix(query, stored)  # to the token, as a token-exact cache would
    assert hit.cached_tokens == expected
    assert hit.cached_tokens < max(len(query), 1)  # at least one token left to prefill
    assert (hit.n_blocks, hit.partial_tokens) == divmod(expected, bs)
    assert hit.cached_tokens == hit.n_blocks * bs + hit.partial_tokens
    assert (
        list(hit.keys[: hit.n_blocks]) == chain_keys(pc.namespace.digest, query, bs)[: hit.n_blocks]
    )
    assert len(hit.keys) == hit.n_blocks + (1 if hit.partial_tokens else 0)
    assert (hit_session.restore() or []) == query[: hit.cached_tokens]
    assert all(pc.is_pinned(k) for k in hit.keys)
    hit_session.close()
    assert pc.hot.stats().pinned == 0
    # Shared blocks are held once; each stored sequence adds at most its partial block.
    unique = {k for s in stored for k in all_keys(pc.namespace.digest, s, bs)}
    assert pc.hot.stats().blocks == len(unique)


@pytest.mark.parametrize("bs", [16, 64])
def test_a_follow_up_turn_reuses_the_whole_previous_request_but_keeps_one_token(bs: int) -> None:
    pc = make(bs)
    first = seq(3 * bs + 5)
    assert serve(pc, first) == 0
    follow_up = first + seq(bs, 9000)
    hit_session = pc.begin(follow_up)
    hit = hit_session.hit
    assert hit.cached_tokens == 3 * bs + 5  # the previous request's partial block, too
    assert (hit.hot_hits, hit.cold_hits, hit.partial_tokens) == (3, 0, 5)
    assert hit.keys[-1] == all_keys(pc.namespace.digest, first, bs)[-1]
    hit_session.close()
    exact = seq(4 * bs)
    pc.store(exact, list(exact))
    assert pc.begin(exact).cached_tokens == 4 * bs - 1  # a whole-prompt match leaves one token


@pytest.mark.parametrize("n", [0, 1, 2, 15, 16, 17])
def test_short_prompts_match_all_but_their_last_token(n: int) -> None:
    pc = make(16)
    pc.store(seq(64), seq(64))
    hit_session = pc.begin(seq(n))
    hit = hit_session.hit
    assert hit.cached_tokens == max(n - 1, 0)
    assert (hit_session.restore() or []) == seq(max(n - 1, 0))
    if n <= 1:
        assert hit.keys == () and hit.lease == 0 and hit_session.restore() is None
    hit_session.close()
    assert pc.hot.stats().pinned == 0
    assert pc.begin(seq(17, 500)).cached_tokens == 0  # no shared token, nothing restored


@pytest.mark.parametrize("bs", [16, 64])
def test_two_conversations_share_their_prefix_blocks(bs: int) -> None:
    pc = make(bs)
    system = seq(2 * bs)
    a, b = system + seq(bs, 1000), system + seq(bs, 2000)
    assert pc.store(a, list(a)) == 3
    assert pc.store(b, list(b)) == 1
    assert pc.hot.stats().blocks == 4
    hit_session = pc.begin([*b, 7])
    hit = hit_session.hit
    assert hit.cached_tokens == 3 * bs and hit.hot_hits == 3


def test_matched_blocks_are_pinned_until_release() -> None:
    bs = 16
    pc = make(bs, hot_bytes=8 * bs * 3)  # room for three blocks
    prompt = seq(2 * bs + 1)
    pc.store(prompt, list(prompt))
    hit_session = pc.begin(prompt)
    hit = hit_session.hit
    assert all(pc.is_pinned(k) for k in hit.keys)
    other = seq(3 * bs, 5000)
    pc.store(other, list(other))  # wants three blocks; only one is free to evict
    assert all(k in pc.hot for k in hit.keys)
    hit_session.close()
    assert not any(pc.is_pinned(k) for k in hit.keys)
    pc.store(other, list(other))
    assert not any(k in pc.hot for k in hit.keys)


def test_release_is_counted_per_hit_and_idempotent() -> None:
    pc = make(16)
    prompt = seq(33)
    pc.store(prompt, list(prompt))
    first, second = pc.begin(prompt), pc.begin(prompt)
    first.close()
    first.finished(None, None)  # a second release must not drop the other request's pin
    assert all(pc.is_pinned(k) for k in second.hit.keys)
    assert pc.stats().active_leases == 1
    second.close()
    assert not any(pc.is_pinned(k) for k in second.hit.keys)
    assert pc.stats().active_leases == 0


@pytest.mark.parametrize("bs", [16, 64])
def test_cold_blocks_are_promoted_after_a_restart(bs: int) -> None:
    cold = FakeColdSource()
    prompt = seq(4 * bs + 3)
    make(bs, cold=cold).store(prompt, list(prompt))
    assert len(cold.puts) == 5  # four full blocks and the partial one

    restarted = make(bs, cold=cold)  # empty RAM, same disk
    hit_session = restarted.begin(prompt)  # a replay: all but the last token
    hit = hit_session.hit
    assert (hit.cached_tokens, hit.hot_hits, hit.cold_hits) == (4 * bs + 2, 0, 4)
    assert hit.partial_tokens == 2
    assert hit_session.restore() == prompt[: 4 * bs + 2]
    assert all(k in restarted.hot for k in hit.keys)
    hit_session.close()
    reads = len(cold.gets)
    again_session = restarted.begin(prompt)
    again = again_session.hit
    assert (again.hot_hits, again.cold_hits, again.cached_tokens) == (4, 0, 4 * bs + 2)
    assert len(cold.gets) == reads
    assert cold.touched == list(again.keys)  # RAM hits reach the cold tier's recency
    restarted.store(prompt, list(prompt))
    assert len(cold.puts) == 5  # promoted blocks are never written back


def test_hot_and_cold_hits_mix_and_stop_at_the_first_miss() -> None:
    bs = 16
    cold = FakeColdSource()
    prompt = seq(5 * bs + 1)
    pc = make(bs, cold=cold)
    pc.store(prompt, list(prompt))
    keys = chain_keys(pc.namespace.digest, prompt, bs)
    pc.hot.clear()
    pc.hot.put(*_hot_args(pc, prompt, 0, keys))
    del cold.blocks[keys[3]]
    hit_session = pc.begin(prompt)
    hit = hit_session.hit
    assert (hit.hot_hits, hit.cold_hits, hit.cached_tokens) == (1, 2, 3 * bs)
    assert keys[4] not in cold.gets  # the walk stopped at block 3
    assert cold.touched == [keys[0]]
    assert hit_session.restore() == prompt[: 3 * bs]


def test_the_disk_part_of_a_prefix_is_asked_for_in_one_batch() -> None:
    bs = 16
    cold = FakeColdSource()
    prompt = seq(6 * bs + 1)
    make(bs, cold=cold).store(prompt, list(prompt))
    keys = chain_keys(namespace(bs).digest, prompt, bs)
    pc = make(bs, cold=cold)
    pc.hot.put(*_hot_args(pc, prompt, 0, keys))
    pc.hot.put(*_hot_args(pc, prompt, 3, keys))  # RAM holds a block in the middle too
    hit_session = pc.begin(prompt)
    hit = hit_session.hit
    assert (hit.hot_hits, hit.cold_hits, hit.cached_tokens) == (2, 4, 6 * bs)
    assert cold.batches == [[keys[1], keys[2], keys[4], keys[5]]]  # RAM's blocks not read
    assert cold.gets == [keys[1], keys[2], keys[4], keys[5]]
    assert list(hit.keys) == keys
    assert hit_session.restore() == prompt[: 6 * bs]
    assert all(k in pc.hot for k in keys)


def test_a_ram_block_evicted_by_the_walk_is_read_alone() -> None:
    bs = 16
    cold = FakeColdSource()
    prompt = seq(4 * bs + 1)
    make(bs, cold=cold).store(prompt, list(prompt))
    keys = chain_keys(namespace(bs).digest, prompt, bs)
    pc = make(bs, hot_bytes=2 * 8 * bs, cold=cold)  # RAM holds two blocks
    pc.hot.put(*_hot_args(pc, prompt, 2, keys))
    hit_session = pc.begin(prompt)  # promoting blocks 0 and 1 pushes block 2 out before its turn
    hit = hit_session.hit
    assert cold.batches == [[keys[0], keys[1], keys[3]]]
    assert cold.gets == [keys[0], keys[1], keys[2], keys[3]]
    assert (hit.hot_hits, hit.cold_hits, hit.cached_tokens) == (0, 4, 4 * bs)
    assert hit_session.restore() == prompt[: 4 * bs]
    hit_session.close()
    assert pc.hot.stats().pinned == 0


def _hot_args(pc: PrefixCache, tokens: list[int], i: int, keys: list[str]) -> tuple:
    """HotTier.put arguments for block ``i`` of ``tokens``, as ``store`` would build them."""
    bs = pc.block_size
    parent = keys[i - 1] if i else pc.namespace.digest
    block = tuple(tokens[i * bs : (i + 1) * bs])
    return BlockMeta(keys[i], parent, pc.namespace.digest, bs), block, block, 8 * bs


def test_a_corrupt_or_foreign_cold_block_is_a_miss() -> None:
    bs = 16
    cold = FakeColdSource()
    prompt = seq(3 * bs + 1)
    make(bs, cold=cold).store(prompt, list(prompt))
    keys = chain_keys(namespace(bs).digest, prompt, bs)
    meta, tokens, _ = cold.blocks[keys[1]]
    cold.blocks[keys[1]] = (meta, tokens, b"not json")
    hit = make(bs, cold=cold).begin(prompt).hit
    assert hit.cached_tokens == bs
    assert keys[1] not in cold.blocks  # dropped, to be recomputed


def test_a_cold_read_error_is_a_miss() -> None:
    class BrokenCold(FakeColdSource):
        def get(self, key: str, parent_key: str):  # type: ignore[override]
            raise OSError("disk gone")

    cold = BrokenCold()
    prompt = seq(33)
    make(16, cold=cold).store(prompt, list(prompt))
    assert make(16, cold=cold).begin(prompt).cached_tokens == 0


def test_store_queues_each_block_once() -> None:
    bs = 16
    cold, codec = FakeColdSource(), FakeCodec()
    pc = make(bs, hot_bytes=8 * bs, cold=cold, codec=codec)  # RAM holds one block only
    prompt = seq(3 * bs)
    assert pc.store(prompt, list(prompt)) == 3
    assert pc.store(prompt, list(prompt)) == 3  # each block pushed the previous one out of RAM
    longer = prompt + seq(bs, 7000)
    pc.store(longer, list(longer))
    assert sorted(cold.puts) == sorted(chain_keys(pc.namespace.digest, longer, bs))
    assert codec.encodes == 4
    s = pc.stats()
    assert s.queued_blocks == 4 and s.stored_blocks == 3 + 3 + 4


def test_a_forgotten_key_falls_back_to_cold_contains() -> None:
    bs = 16
    cold, codec = FakeColdSource(), FakeCodec()
    pc = make(bs, hot_bytes=0, cold=cold, codec=codec, known_keys_limit=1)
    prompt = seq(4 * bs)
    pc.store(prompt, list(prompt))
    pc.store(prompt, list(prompt))
    assert len(cold.puts) == 4 and codec.encodes == 4


def test_blocks_that_do_not_fit_in_ram_still_reach_disk_and_serve_hits() -> None:
    bs = 16
    cold = FakeColdSource()
    pc = make(bs, hot_bytes=0, cold=cold)
    prompt = seq(2 * bs + 1)
    pc.store(prompt, list(prompt))
    assert len(cold.puts) == 3 and pc.hot.stats().blocks == 0
    hit_session = pc.begin(prompt)
    hit = hit_session.hit
    assert hit.cold_hits == 2 and hit_session.restore() == prompt[: 2 * bs]


def test_store_without_cold_source_and_existing_blocks_are_touched() -> None:
    pc = make(16, hot_bytes=8 * 16 * 2)
    a = seq(32)
    pc.store(a, list(a))
    b = seq(16, 500)
    pc.store(seq(16), seq(16))  # touches block 0 of a: block 1 is now the oldest
    pc.store(b, list(b))
    assert chain_keys(pc.namespace.digest, a, 16)[0] in pc.hot
    assert chain_keys(pc.namespace.digest, a, 16)[1] not in pc.hot


def test_stats_count_lookups_and_hits() -> None:
    pc = make(16)
    prompt = seq(40)
    serve(pc, prompt)
    serve(pc, prompt)
    s = pc.stats()
    assert (s.lookups, s.lookup_tokens, s.hit_tokens, s.hot_hits, s.cold_hits) == (2, 80, 39, 2, 0)
    assert (s.partial_hits, s.partial_tokens) == (1, 7)
    assert s.stored_blocks == 3 and s.queued_blocks == 0  # two full blocks and a partial one
    assert s.last_hit_at == FakeClock().now()


def test_a_failing_lookup_is_a_miss_and_leaks_no_pins() -> None:
    class ExplodingCold(FakeColdSource):
        def get(self, key: str, parent_key: str):  # type: ignore[override]
            raise RuntimeError("bug in the cold tier")

        def rows(self, keys):  # type: ignore[override]
            raise RuntimeError("bug in the cold tier")

    bs = 16
    pc = make(bs, cold=ExplodingCold())
    prompt = seq(3 * bs + 1)
    pc.store(prompt[: bs + 1], prompt[: bs + 1])
    session = pc.begin(prompt)  # block 0 from RAM, block 1 explodes: never into the engine
    assert session.cached_tokens == 0 and session.restore() is None
    assert pc.hot.stats().pinned == 0
    assert pc.stats().active_leases == 0
