"""External blocks (the library API's): keys scoped by namespace, the file layout, verification.

No MLX and no files: the key formula, ``pack_layers``/``unpack_layers`` over raw tensors,
and the cold tier over its fakes, which must serve an external block without tokens and
drop one whose key does not follow from its caller's hash.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace

import pytest

from omlx.adapters.blockfiles.format import (
    RawTensor,
    block_metadata,
    encode_block,
    pack_block,
    pack_layers,
    tokens_tensor,
    unpack_block,
    unpack_layers,
)
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.cold_tier import ColdTier, RecencyBuffer
from omlx.domain.cache.keys import (
    EXTERNAL,
    KV,
    STATE,
    block_key,
    external_key,
    namespace_digest,
    object_key,
    rederives,
)
from tests.fakes import FakeBlockIndex, FakeBlockSink, FakeBlockStore, FakeClock, FakeCodec

NS = namespace_digest({"m": "lib"})
OTHER_NS = namespace_digest({"m": "other"})
HASH = bytes(range(32))


def _f32(*values: float) -> RawTensor:
    return RawTensor("F32", (len(values),), struct.pack(f"<{len(values)}f", *values))


def _meta(block_hash: bytes = HASH, token_count: int = 64, ns: str = NS) -> BlockMeta:
    return BlockMeta(external_key(ns, block_hash), block_hash.hex(), ns, token_count, EXTERNAL)


# --- keys ----------------------------------------------------------------------------


def test_external_keys_are_scoped_by_namespace_and_apart_from_other_kinds() -> None:
    key = external_key(NS, HASH)
    anchor = hashlib.sha256(bytes.fromhex(NS) + HASH).hexdigest()
    assert key == object_key(EXTERNAL, anchor) == external_key(NS, bytearray(HASH))
    assert key != external_key(OTHER_NS, HASH)  # two models may use one hash
    assert key not in {HASH.hex(), object_key(KV, anchor), object_key(STATE, anchor)}
    assert len(key) == 64 and external_key(NS, b"\x01") != external_key(NS, b"\x01\x00")
    for bad in (b"", bytes(33)):
        with pytest.raises(ValueError, match="1 to 32 bytes"):
            external_key(NS, bad)


def test_rederives_checks_tokens_for_token_kinds_and_the_hash_for_external() -> None:
    tokens = (1, 2, 3)
    kv = block_key(NS, tokens)
    assert rederives(KV, kv, NS, tokens, NS)
    assert not rederives(KV, kv, NS, (1, 2, 4), NS)
    key = external_key(NS, HASH)
    assert rederives(EXTERNAL, key, HASH.hex(), (), NS)
    assert not rederives(EXTERNAL, key, bytes(32).hex(), (), NS)  # another caller's hash
    assert not rederives(EXTERNAL, key, HASH.hex(), (), OTHER_NS)  # another namespace
    assert not rederives(EXTERNAL, key, HASH.hex(), (7,), NS)  # it carries no tokens
    assert not rederives(EXTERNAL, key, "not hex", (), NS)


# --- the file layout -------------------------------------------------------------------


def test_pack_layers_round_trips_trees_of_tensors_none_and_ints() -> None:
    k, v, conv, ssm = _f32(1, 2), _f32(3, 4), _f32(5), _f32(6, 7, 8)
    scalar = RawTensor("I64", (), struct.pack("<q", 9))
    empty = RawTensor("BF16", (0, 4), b"")
    layers = [(k, v), (k, v, 64), ([conv, None, ssm], None, None), [[(scalar, empty), "KVCache"]]]
    data = pack_layers(_meta(), layers)
    tokens, tensors, metadata = unpack_block(data)
    assert tokens == () and metadata["kind"] == EXTERNAL and metadata["token_count"] == "64"
    assert metadata["parent_key"] == HASH.hex() and metadata["layer_count"] == "4"
    assert sorted(tensors) == [
        "e.0.0",
        "e.0.1",
        "e.1.0",
        "e.1.1",
        "e.2.0",
        "e.2.1",
        "e.3.0",
        "e.3.1",
    ]
    back = unpack_layers(tensors, metadata)
    assert back == layers  # RawTensor compares dtype, shape and bytes; tuples stay tuples
    assert type(back[0]) is tuple and type(back[2][0]) is list and type(back[3][0][0]) is tuple


def test_pack_layers_writes_external_blocks_only() -> None:
    with pytest.raises(ValueError, match="external"):
        pack_layers(replace(_meta(), kind=KV), [(_f32(1), _f32(2))])
    with pytest.raises(ValueError, match="entry 0\\[1\\]: a float"):
        pack_layers(_meta(), [(_f32(1), 1.5)])


def _external_file(layers_doc: object, tensors: dict[str, RawTensor], **meta: str) -> bytes:
    metadata = block_metadata(_meta(), 1, layers=json.dumps(layers_doc))
    metadata.update(meta)
    return bytes(encode_block({"tokens": tokens_tensor(()), **tensors}, metadata))


@pytest.mark.parametrize(
    ("doc", "tensors", "meta", "problem"),
    [
        ([{"t": ["e.0.0", "e.0.1"]}], {"e.0.0": _f32(1)}, {}, "missing or named twice"),
        ([{"t": ["e.0.0", "e.0.0"]}], {"e.0.0": _f32(1)}, {}, "missing or named twice"),
        ([{"t": ["e.0.0"]}], {"e.0.0": _f32(1), "e.0.1": _f32(2)}, {}, "in no layer"),
        ([{"t": ["e.0.0"]}, []], {"e.0.0": _f32(1)}, {}, "layer_count"),
        ([{"t": ["e.0.0", 1.5]}], {"e.0.0": _f32(1)}, {}, "not part of a layer"),
        ([{"x": ["e.0.0"]}], {"e.0.0": _f32(1)}, {}, "not part of a layer"),
        ([{"t": ["e.0.0", {"s": 5}]}], {"e.0.0": _f32(1)}, {}, "not part of a layer"),
        ([[[[[[[[[[["e.0.0"]]]]]]]]]]], {"e.0.0": _f32(1)}, {}, "deeper"),
        ([{"t": ["e.0.0"]}], {"e.0.0": _f32(1)}, {"token_count": "-1"}, "no tokens"),
    ],
)
def test_unpack_block_refuses_an_external_file_that_does_not_add_up(
    doc: object, tensors: dict[str, RawTensor], meta: dict[str, str], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        unpack_block(_external_file(doc, tensors, **meta))


def test_an_external_file_carries_no_tokens_and_needs_its_layers() -> None:
    meta = _meta(token_count=2)
    with_tokens = encode_block(
        {"tokens": tokens_tensor((1, 2)), "e.0.0": _f32(1)},
        block_metadata(meta, 1, layers='[["e.0.0"]]'),
    )
    with pytest.raises(ValueError, match="no tokens"):
        unpack_block(bytes(with_tokens))
    no_layers = encode_block({"tokens": tokens_tensor(())}, block_metadata(meta, 0))
    with pytest.raises(ValueError, match="needs its layers"):
        unpack_block(bytes(no_layers))


def test_kv_blocks_are_unpacked_as_before() -> None:
    tokens = (1, 2)
    meta = BlockMeta(block_key(NS, tokens), NS, NS, 2)
    data = pack_block(meta, tokens, [(_f32(1, 2), _f32(3, 4))])
    assert unpack_block(data)[0] == tokens
    # A KV block's token count must still match its tokens.
    metadata = block_metadata(meta, 0, leaves="", positions="3", token_count="3")
    with pytest.raises(ValueError, match="metadata says 3 tokens"):
        unpack_block(bytes(encode_block({"tokens": tokens_tensor(tokens)}, metadata)))


# --- the cold tier over fakes ------------------------------------------------------------


def _tier() -> tuple[ColdTier, FakeBlockIndex, FakeBlockSink]:
    ns = NamespaceInfo(NS, "lib", "", 64, "per-block", 0)
    clock, store, index = FakeClock(), FakeBlockStore(), FakeBlockIndex()
    sink = FakeBlockSink(store, index, clock)
    codec = FakeCodec()
    tier = ColdTier(
        ns, store, index, sink, codec.decode, clock, RecencyBuffer(index, clock), check=codec.check
    )
    return tier, index, sink


def test_the_cold_tier_serves_an_external_block_by_its_hash_without_tokens() -> None:
    tier, index, sink = _tier()
    meta = _meta()
    tier.put(meta, (), FakeCodec().encode((1, 2, 3), (), meta))
    assert tier.contains(meta.key) and tier.stats().queued == 1
    sink.drain()
    assert index.blocks[meta.key].kind == EXTERNAL and index.blocks[meta.key].token_count == 64
    assert tier.get(meta.key, HASH.hex()) == ((), (1, 2, 3))
    assert tier.stats().hits == 1 and tier.stats().corrupt_blocks == 0


def test_the_cold_tier_refuses_tokens_on_an_external_block() -> None:
    tier, _, sink = _tier()
    meta = _meta(token_count=2)
    tier.put(meta, (1, 2), FakeCodec().encode((1,), (1, 2), meta))
    assert tier.stats().dropped == 1 and sink.queue == {}


def test_an_external_block_whose_key_does_not_follow_from_its_hash_is_dropped() -> None:
    tier, index, sink = _tier()
    meta = _meta()
    tier.put(meta, (), FakeCodec().encode((1,), (), meta))
    sink.drain()
    # Asked for under another hash (a row that names the wrong caller's hash reads alike).
    assert tier.get(meta.key, bytes(32).hex()) is None
    assert tier.stats().corrupt_blocks == 1 and meta.key not in index.blocks


def test_an_external_file_naming_another_hash_is_dropped() -> None:
    tier, index, sink = _tier()
    meta = _meta()
    lying = FakeCodec().encode((1,), (), replace(meta, parent_key=bytes(32).hex()))
    tier.put(meta, (), lying)
    sink.drain()
    assert tier.get(meta.key, HASH.hex()) is None
    assert tier.stats().corrupt_blocks == 1 and meta.key not in index.blocks
