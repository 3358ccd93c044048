"""Block keys and namespace digests: the cache's identity contract (DESIGN §4)."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omlx.domain.cache.keys import (
    CACHE_FORMAT_VERSION,
    KINDS,
    KV,
    STATE,
    block_key,
    chain_keys,
    iter_chain_keys,
    namespace_digest,
    object_key,
)

NS = namespace_digest({"model": "x", "block_size": 4})
token_ids = st.integers(min_value=0, max_value=2**32 - 1)
token_lists = st.lists(token_ids, max_size=80)
block_sizes = st.sampled_from([1, 2, 4, 16])


def test_namespace_digest_is_a_pinned_value() -> None:
    # A change here is a change of the on-disk contract: every stored block is lost.
    # Version 2 (cache layouts: state and window objects) left version 1's blocks behind.
    assert CACHE_FORMAT_VERSION == 2
    assert NS == "8093db097bdf6595aff739c031b54270180d8b1db8a2ef2ddb348abed3d8f8e8"


def test_object_keys_name_a_restore_point_s_objects_apart_from_its_block() -> None:
    anchor = block_key("00" * 32, [1, 2, 3])
    assert object_key(KV, anchor) == anchor
    assert (
        object_key(STATE, anchor) == hashlib.sha256(b"state\0" + bytes.fromhex(anchor)).hexdigest()
    )
    assert len({object_key(k, anchor) for k in KINDS}) == len(KINDS) == 5
    with pytest.raises(ValueError):
        object_key("other", anchor)


def test_block_keys_are_pinned_values() -> None:
    # a literal namespace: the key formula is pinned whatever the format version
    ns = "a34e82ae78a25b57b4cb13f1d0f1d3864df2f4f418fbf8a053572e145887f5c1"
    assert chain_keys(ns, list(range(8)), 4) == [
        "dd84946f60ca4e5022f301f6bf5747e9d5f34604f94025915f5b27b6aec4b834",
        "80542a7a5bedaecb41df74e608232c249eb65cc286f1e28830cbca60cd744c4c",
    ]
    assert block_key("00" * 32, [1, 2, 3]) == (
        "3db346a400ab6b8db792fcf156443a8885b27db208362dcf77084f8c7648e645"
    )


@given(st.lists(token_ids, min_size=1, max_size=8))
def test_block_key_is_sha256_of_parent_and_uint32_le_tokens(tokens: list[int]) -> None:
    expected = hashlib.sha256(bytes.fromhex(NS) + b"".join(struct.pack("<I", t) for t in tokens))
    assert block_key(NS, tokens) == expected.hexdigest()


def test_namespace_digest_ignores_key_order_and_depends_on_every_value() -> None:
    a = namespace_digest({"weights": "w", "block_size": 64, "dtype": "bfloat16"})
    assert a == namespace_digest({"dtype": "bfloat16", "block_size": 64, "weights": "w"})
    assert a != namespace_digest({"weights": "w", "block_size": 16, "dtype": "bfloat16"})
    assert a != namespace_digest({"weights": "w2", "block_size": 64, "dtype": "bfloat16"})


@given(token_lists, token_lists, block_sizes)
def test_same_prefix_gives_same_keys(prefix: list[int], tail: list[int], bs: int) -> None:
    shared = len(prefix) // bs
    assert chain_keys(NS, prefix + tail, bs)[:shared] == chain_keys(NS, prefix, bs)[:shared]


@given(token_lists, block_sizes)
def test_only_full_blocks_are_keyed(tokens: list[int], bs: int) -> None:
    keys = chain_keys(NS, tokens, bs)
    assert len(keys) == len(tokens) // bs
    assert keys == chain_keys(NS, tokens[: len(keys) * bs], bs)


@given(st.lists(token_ids, min_size=1, max_size=80), block_sizes, st.data())
def test_a_changed_token_changes_its_block_and_every_later_one(
    tokens: list[int], bs: int, data: st.DataObject
) -> None:
    pos = data.draw(st.integers(0, len(tokens) - 1))
    new = data.draw(token_ids.filter(lambda t: t != tokens[pos]))
    changed = [*tokens[:pos], new, *tokens[pos + 1 :]]
    before, after = chain_keys(NS, tokens, bs), chain_keys(NS, changed, bs)
    block = pos // bs
    assert before[:block] == after[:block]
    for i in range(block, len(before)):
        assert before[i] != after[i]


@given(token_lists, block_sizes)
def test_other_namespace_shares_no_key(tokens: list[int], bs: int) -> None:
    other = namespace_digest({"model": "x", "block_size": 8})
    assert not set(chain_keys(NS, tokens, bs)) & set(chain_keys(other, tokens, bs))


@pytest.mark.parametrize("bs", [16, 64])
def test_block_boundary_lengths(bs: int) -> None:
    tokens = list(range(2 * bs + 1))
    assert chain_keys(NS, tokens[: bs - 1], bs) == []
    one = chain_keys(NS, tokens[:bs], bs)
    assert len(one) == 1
    assert chain_keys(NS, tokens[: bs + 1], bs) == one
    two = chain_keys(NS, tokens[: 2 * bs], bs)
    assert len(two) == 2 and two[0] == one[0]
    assert two[1] == block_key(one[0], tokens[bs : 2 * bs])


def test_keys_chain_from_the_namespace() -> None:
    tokens = list(range(12))
    keys = chain_keys(NS, tokens, 4)
    parents = [NS, *keys[:-1]]
    assert keys == [block_key(p, tokens[i * 4 : (i + 1) * 4]) for i, p in enumerate(parents)]


@given(token_lists, block_sizes)
def test_the_fast_chain_equals_block_keys_chained_one_by_one(tokens: list[int], bs: int) -> None:
    """``chain_keys`` packs the ids once and chains raw digests: the very same keys."""
    expected, parent = [], NS
    for start in range(0, len(tokens) - bs + 1, bs):
        parent = block_key(parent, tokens[start : start + bs])
        expected.append(parent)
    assert chain_keys(NS, tokens, bs) == expected
    assert list(iter_chain_keys(NS, tuple(tokens), bs)) == expected


def test_a_token_id_out_of_uint32_is_refused_as_before() -> None:
    with pytest.raises((OverflowError, struct.error)):
        chain_keys(NS, [1, 2**32], 2)
    with pytest.raises((OverflowError, struct.error)):
        block_key(NS, [-1])
