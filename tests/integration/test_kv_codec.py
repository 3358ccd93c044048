"""The MLX KV codec: block files round-trip bit for bit, in any tensor order, as standard safetensors."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache
from safetensors.numpy import load as st_load

from omlx.adapters.blockfiles.format import decode_block, encode_block, joined
from omlx.adapters.mlx.cache.blocks import KVBlock
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.keys import block_key

LAYERS, HEADS, DIM = 3, 2, 8


def make_cache(n: int, dtype: mx.Dtype, seed: int = 0) -> list[KVCache]:
    mx.random.seed(seed)
    cache = []
    for _ in range(LAYERS):
        c = KVCache()
        keys = mx.random.normal((1, HEADS, n, DIM)).astype(dtype)
        values = mx.random.normal((1, HEADS, n, DIM)).astype(dtype)
        c.update_and_fetch(keys, values)
        cache.append(c)
    return cache


def block_file(codec: MLXKVCodec, payload: KVBlock, tokens: list[int]) -> bytes:
    meta = BlockMeta(block_key("00" * 32, tokens), "00" * 32, "11" * 32, len(tokens))
    return bytes(codec.encode(payload, tokens, meta))


def same(a: list[KVCache], b: list[KVCache], n: int) -> bool:
    return all(
        x.offset == n
        and bool(mx.array_equal(x.keys, y.keys[..., :n, :]))
        and bool(mx.array_equal(x.values, y.values[..., :n, :]))
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_blocks_round_trip_through_files_and_assemble_bit_for_bit(dtype: mx.Dtype) -> None:
    bs, n = 4, 14
    codec = MLXKVCodec()
    cache = make_cache(n, dtype)
    decoded = []
    for start in range(0, 12, bs):
        payload = codec.split(cache, start, start + bs)
        block = codec.decode(block_file(codec, payload, list(range(start, start + bs))))
        assert block.tokens == tuple(range(start, start + bs))
        assert block.payload.dtype == dtype and codec.nbytes(block.payload) == payload.nbytes
        decoded.append(block.payload)
    assert same(codec.assemble(decoded), cache, 12)
    # Blocks from disk and from RAM mix, and a block's leading positions extend them.
    mixed = [decoded[0], codec.split(cache, 4, 8), decoded[2]]
    last = codec.decode(block_file(codec, codec.split(cache, 12, 14), [1, 2]))
    tail = codec.truncate(last.payload, 1)
    restored = codec.assemble([*mixed, tail])
    assert same(restored, cache, 13)
    assert all(c.keys.dtype == dtype for c in restored)


def test_keys_then_values_one_span_each_and_standard_safetensors() -> None:
    codec = MLXKVCodec()
    cache = make_cache(4, mx.float32)
    data = block_file(codec, codec.split(cache, 0, 4), [5, 6, 7, 8])
    tensors, metadata = decode_block(data)
    names = ["tokens", *(f"k.{i}" for i in range(LAYERS)), *(f"v.{i}" for i in range(LAYERS))]
    assert list(tensors) == names
    assert joined(data, [tensors[f"k.{i}"] for i in range(LAYERS)]) is not None
    assert joined(data, [tensors[f"v.{i}"] for i in range(LAYERS)]) is not None
    assert joined(data, [tensors["k.1"], tensors["k.0"]]) is None  # not in this order
    assert metadata["layer_count"] == str(LAYERS)
    loaded = st_load(data)  # the reference reader agrees, tensor by tensor
    assert loaded["tokens"].tolist() == [5, 6, 7, 8]
    for i, c in enumerate(cache):
        np.testing.assert_array_equal(loaded[f"k.{i}"], np.asarray(c.keys[..., :4, :]))
        np.testing.assert_array_equal(loaded[f"v.{i}"], np.asarray(c.values[..., :4, :]))


def test_any_tensor_order_decodes_the_same() -> None:
    codec = MLXKVCodec()
    cache = make_cache(4, mx.bfloat16)
    data = block_file(codec, codec.split(cache, 0, 4), [1, 2, 3, 4])
    tensors, metadata = decode_block(data)
    # The layout before this change: k.<i>, v.<i> per layer.
    order = ["tokens", *(f"{side}.{i}" for i in range(LAYERS) for side in "kv")]
    interleaved = bytes(encode_block({name: tensors[name] for name in reversed(order)}, metadata))
    a, b = codec.decode(data), codec.decode(interleaved)
    assert a.tokens == b.tokens and a.metadata == b.metadata
    assert same(codec.assemble([b.payload]), codec.assemble([a.payload]), 4)
    assert same(codec.assemble([b.payload]), cache, 4)


def test_malformed_kv_tensors_raise_value_error() -> None:
    codec = MLXKVCodec()
    cache = make_cache(4, mx.float32)
    data = block_file(codec, codec.split(cache, 0, 4), [1, 2, 3, 4])
    tensors, metadata = decode_block(data)
    short = block_file(codec, codec.split(cache, 0, 2), [1, 2])
    short_tensors, _ = decode_block(short)
    cases = [
        ({**tensors, "k.1": tensors["tokens"]}, metadata),  # another dtype and shape
        ({n: t for n, t in tensors.items() if n != "v.2"}, metadata),  # a layer missing
        ({**tensors, **{f"v.{i}": short_tensors[f"v.{i}"] for i in range(LAYERS)}}, metadata),
        (tensors, {**metadata, "layer_count": "0"}),
    ]
    for broken, meta in cases:
        with pytest.raises(ValueError):
            codec.decode(bytes(encode_block(broken, meta)))
