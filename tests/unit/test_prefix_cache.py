"""The prefix cache over fakes: matching, pins, cold promotion, write-through stores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omlx.domain.blocks import BlockMeta, NamespaceInfo
from omlx.domain.hot_tier import HotTier
from omlx.domain.keys import chain_keys, namespace_digest
from omlx.domain.prefix_cache import PrefixCache
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
    return PrefixCache(
        namespace=namespace(bs),
        codec=codec or FakeCodec(),
        hot=HotTier(hot_bytes),
        cold=cold,
        clock=FakeClock(),
        **kwargs,  # type: ignore[arg-type]
    )


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def serve(pc: PrefixCache, tokens: list[int]) -> int:
    """One request: look up, restore, 'compute' the rest, store, release; returns cached tokens."""
    hit = pc.lookup(tokens)
    restored = pc.restore(hit) or []
    assert restored == tokens[: hit.cached_tokens]
    pc.store(tokens, list(tokens))  # the fake cache holds each position's token id
    pc.release(hit)
    return hit.cached_tokens


def common_blocks(a: list[int], b: list[int], bs: int) -> int:
    n = 0
    while (n + 1) * bs <= min(len(a), len(b)) and a[n * bs : (n + 1) * bs] == b[
        n * bs : (n + 1) * bs
    ]:
        n += 1
    return n


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
    hit = pc.lookup(query)
    limit = max((len(query) - 1) // bs, 0)
    expected = min(max(common_blocks(query, s, bs) for s in stored), limit)
    assert hit.cached_tokens == expected * bs == len(hit.keys) * bs
    assert hit.cached_tokens < max(len(query), 1)  # at least one token left to prefill
    assert list(hit.keys) == chain_keys(pc.namespace.digest, query, bs)[:expected]
    assert (pc.restore(hit) or []) == query[: hit.cached_tokens]
    # Shared blocks are held once.
    unique = {k for s in stored for k in chain_keys(pc.namespace.digest, s, bs)}
    assert pc.hot.stats().blocks == len(unique)


@pytest.mark.parametrize("bs", [16, 64])
def test_a_follow_up_turn_reuses_every_block_but_keeps_one_token(bs: int) -> None:
    pc = make(bs)
    first = seq(3 * bs + 5)
    assert serve(pc, first) == 0
    follow_up = first + seq(bs, 9000)
    assert serve(pc, follow_up) == 3 * bs
    exact = seq(4 * bs)
    pc.store(exact, list(exact))
    assert pc.lookup(exact).cached_tokens == 3 * bs  # a whole-prompt match leaves one block


@pytest.mark.parametrize("n", [0, 1, 15, 16])
def test_short_prompts_match_nothing(n: int) -> None:
    pc = make(16)
    pc.store(seq(64), seq(64))
    hit = pc.lookup(seq(n))
    assert hit.keys == () and hit.cached_tokens == 0 and hit.lease == 0
    assert pc.restore(hit) is None
    pc.release(hit)
    assert pc.lookup(seq(17)).cached_tokens == 16


@pytest.mark.parametrize("bs", [16, 64])
def test_two_conversations_share_their_prefix_blocks(bs: int) -> None:
    pc = make(bs)
    system = seq(2 * bs)
    a, b = system + seq(bs, 1000), system + seq(bs, 2000)
    assert pc.store(a, list(a)) == 3
    assert pc.store(b, list(b)) == 1
    assert pc.hot.stats().blocks == 4
    hit = pc.lookup([*b, 7])
    assert hit.cached_tokens == 3 * bs and hit.hot_hits == 3


def test_matched_blocks_are_pinned_until_release() -> None:
    bs = 16
    pc = make(bs, hot_bytes=8 * bs * 3)  # room for three blocks
    prompt = seq(2 * bs + 1)
    pc.store(prompt, list(prompt))
    hit = pc.lookup(prompt)
    assert all(pc.is_pinned(k) for k in hit.keys)
    other = seq(3 * bs, 5000)
    pc.store(other, list(other))  # wants three blocks; only one is free to evict
    assert all(k in pc.hot for k in hit.keys)
    pc.release(hit)
    assert not any(pc.is_pinned(k) for k in hit.keys)
    pc.store(other, list(other))
    assert not any(k in pc.hot for k in hit.keys)


def test_release_is_counted_per_hit_and_idempotent() -> None:
    pc = make(16)
    prompt = seq(33)
    pc.store(prompt, list(prompt))
    first, second = pc.lookup(prompt), pc.lookup(prompt)
    pc.release(first)
    pc.release(first)  # a second release must not drop the other request's pin
    assert all(pc.is_pinned(k) for k in second.keys)
    assert pc.stats().active_leases == 1
    pc.release(second)
    assert not any(pc.is_pinned(k) for k in second.keys)
    assert pc.stats().active_leases == 0


@pytest.mark.parametrize("bs", [16, 64])
def test_cold_blocks_are_promoted_after_a_restart(bs: int) -> None:
    cold = FakeColdSource()
    prompt = seq(4 * bs + 3)
    make(bs, cold=cold).store(prompt, list(prompt))
    assert len(cold.puts) == 4

    restarted = make(bs, cold=cold)  # empty RAM, same disk
    hit = restarted.lookup(prompt)
    assert (hit.cached_tokens, hit.hot_hits, hit.cold_hits) == (4 * bs, 0, 4)
    assert restarted.restore(hit) == prompt[: 4 * bs]
    assert all(k in restarted.hot for k in hit.keys)
    reads = len(cold.gets)
    again = restarted.lookup(prompt)
    assert (again.hot_hits, again.cold_hits) == (4, 0)
    assert len(cold.gets) == reads
    assert cold.touched == list(again.keys)  # RAM hits reach the cold tier's recency
    restarted.store(prompt, list(prompt))
    assert len(cold.puts) == 4  # promoted blocks are never written back


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
    hit = pc.lookup(prompt)
    assert (hit.hot_hits, hit.cold_hits, hit.cached_tokens) == (1, 2, 3 * bs)
    assert keys[4] not in cold.gets  # the walk stopped at block 3
    assert cold.touched == [keys[0]]
    assert pc.restore(hit) == prompt[: 3 * bs]


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
    hit = make(bs, cold=cold).lookup(prompt)
    assert hit.cached_tokens == bs
    assert keys[1] not in cold.blocks  # dropped, to be recomputed


def test_a_cold_read_error_is_a_miss() -> None:
    class BrokenCold(FakeColdSource):
        def get(self, key: str, parent_key: str):  # type: ignore[override]
            raise OSError("disk gone")

    cold = BrokenCold()
    prompt = seq(33)
    make(16, cold=cold).store(prompt, list(prompt))
    assert make(16, cold=cold).lookup(prompt).cached_tokens == 0


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
    assert len(cold.puts) == 2 and pc.hot.stats().blocks == 0
    hit = pc.lookup(prompt)
    assert hit.cold_hits == 2 and pc.restore(hit) == prompt[: 2 * bs]


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
    assert (s.lookups, s.lookup_tokens, s.hit_tokens, s.hot_hits, s.cold_hits) == (2, 80, 32, 2, 0)
    assert s.stored_blocks == 2 and s.queued_blocks == 0
    assert s.last_hit_at == FakeClock().now()


def test_a_failing_lookup_leaks_no_pins() -> None:
    class ExplodingCold(FakeColdSource):
        def get(self, key: str, parent_key: str):  # type: ignore[override]
            raise RuntimeError("bug in the cold tier")

    bs = 16
    pc = make(bs, cold=ExplodingCold())
    prompt = seq(3 * bs + 1)
    pc.store(prompt[: bs + 1], prompt[: bs + 1])
    with pytest.raises(RuntimeError):
        pc.lookup(prompt)  # block 0 from RAM, block 1 explodes
    assert pc.hot.stats().pinned == 0
    assert pc.stats().active_leases == 0
