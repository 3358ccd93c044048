"""Token-granular matching over fakes: partial blocks, diverging children, disk candidates."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.keys import block_key, chain_keys
from omlx.domain.cache.partial_match import MAX_COLD_CANDIDATE_READS, common_prefix, upper_bound
from tests.fakes import FakeCodec, FakeColdSource
from tests.unit.test_prefix_cache import (
    all_keys,
    best_prefix,
    conversations,
    make,
    namespace,
    seq,
    serve,
)

tokens = st.lists(st.integers(0, 5), max_size=40)


@given(tokens, tokens)
def test_common_prefix_is_the_longest_shared_run(a: list[int], b: list[int]) -> None:
    k = common_prefix(a, b)
    assert a[:k] == b[:k] and k == common_prefix(b, a)
    assert k == min(len(a), len(b)) or a[k] != b[k]


@given(tokens.filter(bool), tokens)
def test_upper_bound_never_underestimates(block: list[int], want: list[int]) -> None:
    parent = namespace(16).digest
    meta = BlockMeta(block_key(parent, block), parent, parent, len(block))
    bound = upper_bound(meta, want)
    assert common_prefix(block, want) <= bound <= len(want)
    if len(block) <= len(want) and want[: len(block)] == block:
        assert bound == len(block)  # proven by the key alone


@settings(max_examples=80, deadline=None)
@given(
    conversations,
    st.integers(0, 300),
    st.lists(st.integers(0, 50_000), max_size=80),
    st.integers(0, 8),
    st.booleans(),
)
def test_a_partial_match_never_exceeds_the_common_prefix(
    conv: tuple[int, list[int], list[tuple[int, list[int]]]],
    cut: int,
    tail: list[int],
    ram_blocks: int,
    restart: bool,
) -> None:
    """Under any RAM budget, with or without a restart onto the disk tier."""
    bs, stem, branches = conv
    stored = [stem[:c] + t for c, t in branches]
    cold = FakeColdSource()
    pc = make(bs, hot_bytes=8 * bs * ram_blocks, cold=cold)
    for tokens in stored:
        serve(pc, tokens)
    if restart:
        pc = make(bs, hot_bytes=8 * bs * ram_blocks, cold=cold)
    query = stem[:cut] + tail
    hit_session = pc.begin(query)
    hit = hit_session.hit
    assert hit.cached_tokens <= best_prefix(query, stored)
    assert hit.cached_tokens < max(len(query), 1)
    assert 0 <= hit.partial_tokens < bs
    assert (hit_session.restore() or []) == query[
        : hit.cached_tokens
    ]  # the KV of exactly those tokens
    if len(branches) <= MAX_COLD_CANDIDATE_READS:
        # The disk holds every block, and each branch adds at most one child per parent:
        # every candidate gets read, so nothing is lost to the RAM budget or the restart.
        assert hit.cached_tokens == best_prefix(query, stored)
    hit_session.close()
    assert pc.hot.stats().pinned == 0 and pc.stats().active_leases == 0
    assert pc.hot.stats().bytes <= pc.hot.max_bytes


def test_a_child_block_with_a_diverging_tail_gives_its_common_prefix() -> None:
    bs = 16
    pc = make(bs)
    a = seq(3 * bs)
    pc.store(a, list(a))
    query = a[: bs + 5] + seq(20, 9000)  # leaves a's block 1 after its 5th token
    hit_session = pc.begin(query)
    hit = hit_session.hit
    keys = chain_keys(pc.namespace.digest, a, bs)
    assert (hit.cached_tokens, hit.n_blocks, hit.partial_tokens) == (bs + 5, 1, 5)
    assert hit.keys == (keys[0], keys[1])
    assert hit_session.restore() == a[: bs + 5]


def test_the_longest_of_several_children_wins() -> None:
    bs = 16
    pc = make(bs)
    stem = seq(bs)
    for tail_len, start in ((3, 100), (9, 200), (6, 300)):
        branch = stem + seq(tail_len, start)
        pc.store(branch, list(branch))
    query = stem + seq(9, 200) + [7, 7]
    hit_session = pc.begin(query)
    hit = hit_session.hit
    assert hit.cached_tokens == bs + 9 and hit.partial_tokens == 9


def test_the_partial_block_is_pinned_while_used_and_released() -> None:
    bs = 16
    pc = make(bs, hot_bytes=8 * (bs + 5))  # room for one full block and the partial one
    first = seq(bs + 5)
    serve(pc, first)
    partial_key = all_keys(pc.namespace.digest, first, bs)[-1]
    hit_session = pc.begin([*first, 1, 2])
    hit = hit_session.hit
    assert hit.keys[-1] == partial_key and pc.is_pinned(partial_key)
    other = seq(bs, 7000)
    pc.store(other, list(other))  # needs room: only unpinned blocks may go, and none is
    assert partial_key in pc.hot
    hit_session.close()
    assert not pc.is_pinned(partial_key) and pc.hot.stats().pinned == 0
    pc.store(other, list(other))
    assert other and chain_keys(pc.namespace.digest, other, bs)[0] in pc.hot


def test_the_partial_block_is_stored_once_and_queued_once() -> None:
    bs = 16
    cold, codec = FakeColdSource(), FakeCodec()
    pc = make(bs, cold=cold, codec=codec)
    tokens = seq(2 * bs + 7)
    assert pc.store(tokens, list(tokens)) == 3
    assert pc.store(tokens, list(tokens)) == 0
    keys = all_keys(pc.namespace.digest, tokens, bs)
    assert cold.puts == keys and codec.encodes == 3
    meta, stored, _ = cold.blocks[keys[-1]]
    assert (meta.token_count, meta.parent_key, stored) == (7, keys[1], tuple(tokens[2 * bs :]))


def test_a_partial_match_from_disk_after_a_restart_is_read_verified_and_promoted() -> None:
    bs = 16
    cold = FakeColdSource()
    first = seq(2 * bs + 10)
    make(bs, cold=cold).store(first, list(first))
    restarted = make(bs, cold=cold)
    query = first[: 2 * bs + 6] + seq(5, 9000)  # diverges inside the stored partial block
    hit_session = restarted.begin(query)
    hit = hit_session.hit
    partial_key = all_keys(restarted.namespace.digest, first, bs)[-1]
    assert (hit.cached_tokens, hit.cold_hits, hit.partial_tokens) == (2 * bs + 6, 2, 6)
    assert hit.partial_from_disk  # a request's tier reads "ssd" even for a prompt under a block
    assert partial_key in cold.gets and partial_key in restarted.hot
    assert hit_session.restore() == query[: 2 * bs + 6]
    hit_session.close()
    reads = len(cold.gets)
    again = restarted.begin(query)
    assert again.cached_tokens == 2 * bs + 6 and not again.hit.partial_from_disk
    assert len(cold.gets) == reads  # the second time from RAM


def test_a_corrupt_partial_block_on_disk_is_not_served() -> None:
    bs = 16
    cold = FakeColdSource()
    first = seq(bs + 10)
    make(bs, cold=cold).store(first, list(first))
    partial_key = all_keys(namespace(bs).digest, first, bs)[-1]
    meta, tokens, _ = cold.blocks[partial_key]
    forged = FakeCodec().encode(tokens, seq(10, 500), meta)  # tokens that do not rehash to the key
    cold.blocks[partial_key] = (meta, tokens, forged)
    hit = make(bs, cold=cold).begin(first).hit
    assert hit.cached_tokens == bs and hit.partial_tokens == 0
    assert partial_key not in cold.blocks  # dropped, to be recomputed


def test_the_disk_is_not_asked_when_ram_already_gives_the_most() -> None:
    bs = 16
    cold = FakeColdSource()
    pc = make(bs, cold=cold)
    first = seq(bs + 10)
    serve(pc, first)
    cold.children_calls.clear()
    hit_session = pc.begin(first)
    hit = hit_session.hit
    assert hit.cached_tokens == bs + 9
    assert cold.children_calls == []


def test_at_most_a_few_disk_candidates_are_read() -> None:
    bs = 16
    cold = FakeColdSource()
    writer = make(bs, cold=cold)
    for i in range(8):  # eight first blocks sharing only their first token with the query
        branch = [1, *seq(bs - 1, 1000 * (i + 1))]
        writer.store(branch, list(branch))
    query = [1, *seq(bs, 500)]
    hit = make(bs, cold=cold).begin(query).hit
    assert hit.cached_tokens == 1
    walk_miss = chain_keys(namespace(bs).digest, query, bs)[0]
    assert cold.rows_calls == [[walk_miss]]  # the walk's miss: the index says so, no read
    assert len(cold.gets) == MAX_COLD_CANDIDATE_READS


def test_an_exact_disk_candidate_is_found_by_its_key_with_one_read() -> None:
    bs = 16
    cold = FakeColdSource()
    writer = make(bs, cold=cold)
    stem = seq(bs)
    for start in (100, 200, 300, 400):
        branch = stem + seq(5, start)
        writer.store(branch, list(branch))
    restarted = make(bs, cold=cold)
    query = stem + seq(5, 300) + [9, 9]
    hit_session = restarted.begin(query)
    hit = hit_session.hit
    assert hit.cached_tokens == bs + 5
    full_key = chain_keys(restarted.namespace.digest, stem, bs)[0]
    # The other three rank lower unread: their keys prove they share at most 4 tokens.
    assert cold.gets == [full_key, block_key(full_key, seq(5, 300))]


def test_a_failing_child_lookup_is_a_miss_and_leaks_no_pins() -> None:
    class ExplodingChildren(FakeColdSource):
        def children(self, parent_key: str):  # type: ignore[override]
            raise RuntimeError("bug in the cold tier")

    bs = 16
    pc = make(bs, cold=ExplodingChildren())
    prompt = seq(3 * bs + 1)
    pc.store(prompt[: 2 * bs], prompt[: 2 * bs])
    session = pc.begin(prompt)  # blocks 0 and 1 from RAM, then the children lookup explodes
    assert session.cached_tokens == 0
    assert pc.hot.stats().pinned == 0
    assert pc.stats().active_leases == 0
