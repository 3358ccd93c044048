"""Whose work a restore used: two prefix caches (servers "a" and "b") over one cold source.

Each block carries the server that computed it into its row; a block read back keeps its
row's name in RAM; the probe names who computed the deepest block it counts; lookups count
their hit tokens by tier and origin, summing to ``hit_tokens``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from omlx.domain.cache.keys import chain_keys
from omlx.domain.cache.origins import PEER, SELF, UNKNOWN, origin_of
from omlx.domain.cache.prefix_cache import PrefixCache
from tests.fakes import FakeColdSource
from tests.unit.test_prefix_cache import make, seq, serve

BS = 16


def pair(**kw: object) -> tuple[PrefixCache, PrefixCache, FakeColdSource]:
    cold = FakeColdSource()
    return make(BS, cold=cold, server_id="a", **kw), make(BS, cold=cold, server_id="b"), cold


def by(pc: PrefixCache) -> dict[tuple[str, str], int]:
    s = pc.stats()
    assert sum(s.hit_tokens_by.values()) == s.hit_tokens  # the labels split the total
    return {k: v for k, v in s.hit_tokens_by.items() if v}


@pytest.mark.parametrize(
    ("computed_by", "here", "origin"),
    [("a", "a", SELF), ("a", "b", PEER), ("", "a", UNKNOWN), (None, "a", UNKNOWN), ("a", "", PEER)],
)
def test_origin_of(computed_by: str | None, here: str, origin: str) -> None:
    assert origin_of(computed_by, here) == origin


def test_b_restores_what_a_computed_and_says_so_from_disk_then_from_ram() -> None:
    a, b, cold = pair()
    prompt = seq(3 * BS + 5)
    serve(a, prompt)
    assert {meta.computed_by for meta, _, _ in cold.blocks.values()} == {"a"}
    assert b.probe(prompt).computed_by == "a"
    assert serve(b, prompt) == len(prompt) - 1  # three blocks and A's partial one, from disk
    assert by(b) == {("ssd", PEER): len(prompt) - 1}
    keys = chain_keys(b.namespace.digest, prompt[: 3 * BS], BS)
    assert {b.hot.peek(k).meta.computed_by for k in keys} == {"a"}  # RAM keeps the row's name
    probed = b.probe(prompt)
    assert (probed.tier, probed.computed_by) == ("hot", "a")
    serve(b, prompt)
    assert by(b) == {("ssd", PEER): len(prompt) - 1, ("hot", PEER): len(prompt) - 1}


def test_a_follow_up_names_the_server_that_computed_its_deepest_block() -> None:
    a, b, _ = pair()
    first = seq(2 * BS)
    serve(a, first)
    follow = [*first, *seq(2 * BS, 500)]
    serve(b, follow)  # A's two blocks from disk, B computes and keeps the next two
    assert by(b) == {("ssd", PEER): 2 * BS}
    again = [*follow, 7]
    assert b.probe(again).computed_by == "b"
    assert b.probe(first).computed_by == "a"
    serve(b, again)
    assert by(b) == {("ssd", PEER): 2 * BS, ("hot", PEER): 2 * BS, ("hot", SELF): 2 * BS}


def test_a_row_without_a_name_is_unknown() -> None:
    a, b, cold = pair()
    prompt = seq(2 * BS + 1)
    serve(a, prompt)
    for key, (meta, tokens, data) in list(cold.blocks.items()):  # written before 0019
        cold.blocks[key] = (replace(meta, computed_by=""), tokens, data)
    assert b.probe(prompt).computed_by == ""
    serve(b, prompt)
    assert by(b) == {("ssd", UNKNOWN): 2 * BS}


def test_a_partial_block_from_disk_is_counted_with_its_own_name() -> None:
    a, b, cold = pair()
    serve(a, seq(BS + 5))  # one block and a partial one of five tokens
    partial = next(m for m, _, _ in cold.blocks.values() if m.token_count == 5)
    cold.blocks[partial.key] = (replace(partial, computed_by="c"), *cold.blocks[partial.key][1:])
    probed = b.probe(seq(BS + 8))  # the partial block is its deepest: known by its key
    assert (probed.tokens, probed.tier, probed.computed_by) == (BS + 5, "ssd", "c")
    assert serve(b, seq(BS + 8)) == BS + 5
    assert by(b) == {("ssd", PEER): BS + 5}


def test_nothing_restored_names_nobody_and_counts_nothing() -> None:
    _, b, _ = pair()
    assert b.probe(seq(40)).computed_by == ""
    serve(b, seq(40))
    assert by(b) == {}
