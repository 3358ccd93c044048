"""Quantized KV blocks (``kv_bits``): the codec stores codes, scales and biases, and round-trips them."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache
from safetensors.numpy import load as st_load

from omlx.adapters.blockfiles.format import QUANT_PARTS, decode_block, encode_block
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.layout import Leaf, ModelLayout
from omlx.adapters.mlx.cache.quantized import QuantizedKVBlock
from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.keys import block_key
from omlx.domain.cache.kv_quant import KVQuant

LAYERS, HEADS, DIM = 3, 2, 64


def make_cache(n: int, dtype: mx.Dtype, dim: int = DIM, seed: int = 0) -> list[KVCache]:
    mx.random.seed(seed)
    cache = []
    for _ in range(LAYERS):
        c = KVCache()
        c.update_and_fetch(
            mx.random.normal((1, HEADS, n, dim)).astype(dtype),
            mx.random.normal((1, HEADS, n, dim)).astype(dtype),
        )
        cache.append(c)
    return cache


def block_file(codec: MLXKVCodec, payload, tokens: list[int], kind: str = "kv") -> bytes:
    meta = BlockMeta(block_key("00" * 32, tokens), "00" * 32, "11" * 32, len(tokens), kind)
    return bytes(codec.encode(payload, tokens, meta))


def reference(cache: list[KVCache], quant: KVQuant, n: int) -> list[tuple[mx.array, mx.array]]:
    """What mlx's own quantize / dequantize make of each layer (float16 scales for float32)."""
    out = []
    for c in cache:
        sides = []
        for x in (c.keys[..., :n, :], c.values[..., :n, :]):
            w, s, b = mx.quantize(x, group_size=quant.group_size, bits=quant.bits)
            if x.dtype == mx.float32:
                s, b = (
                    s.astype(mx.float16).astype(mx.float32),
                    b.astype(mx.float16).astype(mx.float32),
                )
            sides.append(mx.dequantize(w, s, b, group_size=quant.group_size, bits=quant.bits))
        out.append((sides[0].astype(x.dtype), sides[1].astype(x.dtype)))
    return out


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_quantized_blocks_round_trip_files_and_ram_alike(bits: int, dtype: mx.Dtype) -> None:
    bs, n = 4, 14
    quant = KVQuant(bits, 32)
    codec = MLXKVCodec(kv_quant=quant)
    cache = make_cache(n, dtype)
    from_ram, from_disk = [], []
    for start in range(0, 12, bs):
        payload = codec.split(cache, start, start + bs)
        assert isinstance(payload, QuantizedKVBlock) and payload.dtype == dtype
        block = codec.decode(block_file(codec, payload, list(range(start, start + bs))))
        assert codec.nbytes(block.payload) == payload.nbytes
        from_ram.append(payload)
        from_disk.append(block.payload)
    a, b = codec.assemble(from_ram), codec.assemble(from_disk)
    expected = reference(cache, quant, 12)
    for x, y, (k, v) in zip(a, b, expected, strict=True):
        assert x.offset == y.offset == 12 and x.keys.dtype == dtype
        # A block read back equals the one kept in RAM, and both equal mlx's own round trip.
        assert mx.array_equal(x.keys[..., :12, :], y.keys[..., :12, :])
        assert mx.array_equal(x.values[..., :12, :], y.values[..., :12, :])
        assert mx.array_equal(x.keys[..., :12, :], k) and mx.array_equal(x.values[..., :12, :], v)
    # Close to the original, as the bit width allows.
    err = max(
        float(mx.abs(x.keys[..., :12, :] - c.keys[..., :12, :]).max())
        for x, c in zip(a, cache, strict=False)
    )
    assert err < (0.05 if bits == 8 else 0.6)
    # A block's leading positions (token-granular restore) are cut from codes, scales, biases.
    tail = codec.truncate(
        codec.decode(block_file(codec, codec.split(cache, 12, 14), [1, 2])).payload, 1
    )
    restored = codec.assemble([*from_disk, tail])
    assert restored[0].offset == 13
    assert mx.array_equal(restored[0].keys[..., :12, :], b[0].keys[..., :12, :])


def test_bytes_per_token_meet_the_targets_on_float32() -> None:
    cache = make_cache(64, mx.float32)
    plain = MLXKVCodec().split(cache, 0, 64).nbytes
    eight = MLXKVCodec(kv_quant=KVQuant(8, 64)).split(cache, 0, 64).nbytes
    four = MLXKVCodec(kv_quant=KVQuant(4, 64)).split(cache, 0, 64).nbytes
    assert eight / plain <= 0.28 and four / plain <= 0.16
    assert eight / plain == pytest.approx(68 / 256) and four / plain == pytest.approx(36 / 256)


def test_a_quantized_file_is_standard_safetensors_with_named_parts() -> None:
    codec = MLXKVCodec(kv_quant=KVQuant(8, 64))
    cache = make_cache(4, mx.float32)
    data = block_file(codec, codec.split(cache, 0, 4), [5, 6, 7, 8])
    tensors, metadata = decode_block(data)
    assert metadata["kv_bits"] == "8" and metadata["kv_group_size"] == "64"
    assert metadata["kv_dtype"] == "F32"
    expected = ["tokens", *(f"k.{i}" for i in range(LAYERS)), *(f"v.{i}" for i in range(LAYERS))]
    expected += [f"{p}.{i}" for p in QUANT_PARTS for i in range(LAYERS)]
    assert list(tensors) == expected
    loaded = st_load(data)
    w, s, b = mx.quantize(cache[1].keys[..., :4, :], group_size=64, bits=8)
    assert np.array_equal(loaded["k.1"], np.asarray(w))
    assert np.array_equal(loaded["k_scales.1"], np.asarray(s.astype(mx.float16)))
    assert np.array_equal(loaded["k_biases.1"], np.asarray(b.astype(mx.float16)))


def test_a_quantized_file_missing_a_part_or_with_bad_shapes_is_refused() -> None:
    codec = MLXKVCodec(kv_quant=KVQuant(4, 64))
    data = block_file(codec, codec.split(make_cache(4, mx.float32), 0, 4), [1, 2, 3, 4])
    tensors, metadata = decode_block(data)
    missing = {k: v for k, v in tensors.items() if k != "v_biases.2"}
    with pytest.raises(ValueError, match=r"v_biases\.2"):
        codec.decode(bytes(encode_block(missing, metadata)))
    with pytest.raises(ValueError, match="do not fit"):
        codec.decode(bytes(encode_block(tensors, {**metadata, "kv_bits": "8"})))
    with pytest.raises(ValueError):
        codec.decode(bytes(encode_block(tensors, {**metadata, "kv_bits": "3"})))


def test_a_head_dim_the_group_size_does_not_divide_stays_in_its_dtype() -> None:
    codec = MLXKVCodec(kv_quant=KVQuant(8, 64))
    cache = make_cache(8, mx.float32, dim=48)
    payload = codec.split(cache, 0, 8)
    assert not isinstance(payload, QuantizedKVBlock)
    restored = codec.assemble([codec.decode(block_file(codec, payload, list(range(8)))).payload])
    assert mx.array_equal(restored[0].keys[..., :8, :], cache[0].keys[..., :8, :])


def test_window_leaves_are_quantized_and_state_leaves_are_not() -> None:
    from mlx_lm.models.cache import ArraysCache

    layout = ModelLayout(
        leaves=(Leaf((0,), "kv"), Leaf((1,), "window", window=8), Leaf((2,), "state", slots=1)),
        shape=(0, 1, 2),
        signature=("test",),
    )
    codec = MLXKVCodec(layout, KVQuant(8, 32))
    mx.random.seed(1)
    full, window, state = KVCache(), RotatingKVCache(max_size=8, keep=0), ArraysCache(1)
    k, v = mx.random.normal((1, HEADS, 8, DIM)), mx.random.normal((1, HEADS, 8, DIM))
    full.update_and_fetch(k, v)
    window.update_and_fetch(k, v)
    state[0] = mx.random.normal((1, 4, 16))
    cache = [full, window, state]
    kv, win, snap = codec.split(cache, 0, 8), codec.split_window(cache, 0, 8), codec.snapshot(cache)
    assert isinstance(kv, QuantizedKVBlock) and isinstance(win, QuantizedKVBlock)
    restored = codec.assemble(
        [codec.decode(block_file(codec, kv, list(range(8)))).payload],
        [codec.decode(block_file(codec, win, list(range(8)), "window")).payload],
        codec.decode(block_file(codec, snap, list(range(8)), "state")).payload,
    )
    assert mx.array_equal(restored[2][0], state[0])  # the state, bit for bit
    assert float(mx.abs(restored[1].keys[..., :8, :] - k).max()) < 0.05


def test_the_library_exposes_the_same_codec() -> None:
    from omlx.cache import kv_codec

    cache = make_cache(8, mx.float32)
    library, server = kv_codec(kv_bits=8), MLXKVCodec(kv_quant=KVQuant(8, 64))
    data = block_file(library, library.split(cache, 0, 8), list(range(8)))
    assert data == block_file(server, server.split(cache, 0, 8), list(range(8)))
    assert isinstance(server.decode(data).payload, QuantizedKVBlock)
    assert kv_codec().kv_quant is None and kv_codec("off").kv_quant is None
    with pytest.raises(ValueError, match="kv_bits"):
        kv_codec(kv_bits=3)
