"""Exact mode's batch cache (``BatchQuantizedKVCache``) against mlx-lm's own classes.

Its batch operations are checked against mlx-lm's ``BatchKVCache`` driven with each
quantized component as if it were the KV (the moves must be the same, position for
position), and its attention row by row against a single-sequence quantized cache.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import (
    BatchQuantizedKVCache,
    ExactKVCache,
    quantize_exact,
)

HEADS, DIM = 2, 64


def kv(n: int, batch: int = 1, dtype=mx.float32) -> tuple[mx.array, mx.array]:
    return (
        mx.random.normal((batch, HEADS, n, DIM)).astype(dtype),
        mx.random.normal((batch, HEADS, n, DIM)).astype(dtype),
    )


class Mirror:
    """Six ``BatchKVCache``s, one per (side, component): what the quantized batch must hold."""

    def __init__(self, parts: list[BatchKVCache]) -> None:
        self.parts = parts  # keys' codes, scales, biases, then values' (as ``keys`` of each)

    @classmethod
    def merge(cls, rows: list[ExactKVCache]) -> Mirror:
        parts = []
        for side in ("keys", "values"):
            for c in range(3):
                singles = []
                for r in rows:
                    k = KVCache()
                    if r.keys is not None and r.offset:
                        held = getattr(r, side)[c][..., : r.offset, :]
                        k.keys, k.values, k.offset = held, held, r.offset
                    singles.append(k)
                parts.append(BatchKVCache.merge(singles))
        return cls(parts)

    def update(self, keys: mx.array, values: mx.array, bits: int, group: int) -> None:
        quantized = (*quantize_exact(keys, group, bits), *quantize_exact(values, group, bits))
        for part, q in zip(self.parts, quantized, strict=True):
            part.update_and_fetch(q, q)

    def each(self, name: str, *args, **kwargs) -> None:
        for part in self.parts:
            getattr(part, name)(*args, **kwargs)

    def assert_same(self, batch: BatchQuantizedKVCache) -> None:
        first = self.parts[0]
        assert batch._idx == first._idx
        assert batch.offset.tolist() == first.offset.tolist()
        assert batch.left_padding.tolist() == first.left_padding.tolist()
        held = (*batch.keys_and_values()[0], *batch.keys_and_values()[1])
        for part, component in zip(self.parts, held, strict=True):
            expected = part.keys_and_values()[0]
            assert component.shape == expected.shape
            assert component.dtype == expected.dtype
            assert mx.array_equal(component, expected).item()


def filled(n: int, bits: int, group: int, dtype=mx.float32) -> ExactKVCache:
    cache = ExactKVCache(group_size=group, bits=bits)
    if n:
        cache.update_and_fetch(*kv(n, dtype=dtype))
    return cache


@pytest.mark.parametrize(("bits", "group"), [(8, 64), (4, 32)])
def test_batch_operations_move_codes_as_mlx_lm_moves_kv(bits, group) -> None:
    mx.random.seed(1)
    rows = [filled(n, bits, group) for n in (5, 0, 12)]
    batch, mirror = ExactKVCache.merge(rows), Mirror.merge(rows)
    assert isinstance(batch, BatchQuantizedKVCache)
    mirror.assert_same(batch)

    step = kv(3, batch=3)  # a decode-like chunk for every row
    batch.update_and_fetch(*step)
    mirror.update(*step, bits, group)
    mirror.assert_same(batch)

    # A right-padded prefill chunk: rows of 4, 2 and 3 tokens, rolled back into place.
    chunk, lengths, right = kv(4, batch=3), [4, 2, 3], [0, 2, 1]
    batch.prepare(lengths=lengths, right_padding=right)
    mirror.each("prepare", lengths=lengths, right_padding=right)
    batch.update_and_fetch(*chunk)
    mirror.update(*chunk, bits, group)
    batch.finalize()
    mirror.each("finalize")
    mirror.assert_same(batch)

    batch.trim(2)  # a refused draft
    mirror.each("trim", 2)
    mirror.assert_same(batch)

    others = [filled(n, bits, group) for n in (300, 1)]  # longer than one step of buffer
    other, other_mirror = ExactKVCache.merge(others), Mirror.merge(others)
    batch.extend(other)
    for part, o in zip(mirror.parts, other_mirror.parts, strict=True):
        part.extend(o)
    mirror.assert_same(batch)

    batch.filter([0, 2, 4])
    mirror.each("filter", [0, 2, 4])
    mirror.assert_same(batch)

    fresh = ExactKVCache.merge([filled(0, bits, group)])  # a new row with nothing yet
    assert fresh.keys is None
    batch.extend(fresh)
    for part in mirror.parts:
        part.extend(BatchKVCache.merge([KVCache()]))
    mirror.assert_same(batch)

    for i in range(4):
        row = batch.extract(i)
        assert isinstance(row, ExactKVCache) and (row.bits, row.group_size) == (bits, group)
        for component, part in zip((*row.keys, *row.values), mirror.parts, strict=True):
            assert mx.array_equal(component, part.extract(i).keys).item()
    assert batch.nbytes == sum(c.nbytes for c in (*batch.keys, *batch.values))


def test_a_row_extracted_and_merged_again_keeps_its_codes() -> None:
    mx.random.seed(2)
    row = filled(70, 8, 64)
    again = ExactKVCache.merge([row]).extract(0)
    for a, b in zip((*row.keys, *row.values), (*again.keys, *again.values), strict=True):
        assert mx.array_equal(a[..., :70, :], b).item()


def test_float32_kv_keeps_float16_scales_and_biases_as_blocks_store_them() -> None:
    mx.random.seed(3)
    x = mx.random.normal((1, HEADS, 9, DIM))
    codes, scales, biases = quantize_exact(x, 64, 8)
    ref_codes, ref_scales, ref_biases = mx.quantize(x, group_size=64, bits=8)
    assert mx.array_equal(codes, ref_codes).item()
    assert scales.dtype == biases.dtype == mx.float16
    assert mx.array_equal(scales, ref_scales.astype(mx.float16)).item()
    assert mx.array_equal(biases, ref_biases.astype(mx.float16)).item()
    row = filled(9, 8, 64)
    assert row.kv_dtype == mx.float32 and row.keys[1].dtype == mx.float16
    batch = ExactKVCache.merge([row])
    assert batch.kv_dtype == mx.float32 and batch.extract(0).kv_dtype == mx.float32


def attention(cache, queries: mx.array, mask) -> mx.array:
    keys, values = cache.keys_and_values()
    # A copy: mlx-lm's quantized attention scales its queries in place.
    return scaled_dot_product_attention(
        queries * 1, keys, values, cache, scale=DIM**-0.5, mask=mask
    )


@pytest.mark.parametrize("dtype", [mx.float16, mx.float32])
def test_attention_row_by_row_equals_a_single_sequence_cache(dtype) -> None:
    """Each row of a left-padded batch attends as a lone sequence does: mlx-lm's own
    ``QuantizedKVCache`` for float16 KV (the same scales there), ``ExactKVCache`` (mlx-lm's
    with float16 scales) for float32."""
    mx.random.seed(4)
    bits, group, lengths = 8, 64, (7, 30, 1)
    prompts = [kv(n, dtype=dtype) for n in lengths]
    single_class = QuantizedKVCache if dtype == mx.float16 else ExactKVCache
    singles = [single_class(group_size=group, bits=bits) for _ in lengths]
    rows = [ExactKVCache(group_size=group, bits=bits) for _ in lengths]
    for p, s, r in zip(prompts, singles, rows, strict=True):
        s.update_and_fetch(*p)
        r.update_and_fetch(*p)
    batch = ExactKVCache.merge(rows)
    for _ in range(3):  # decode steps, then a two-token step (a verified draft)
        for n in (1, 1, 1, 2):
            keys, values = kv(n, batch=len(lengths), dtype=dtype)
            queries = mx.random.normal((len(lengths), HEADS, n, DIM)).astype(dtype)
            mask = batch.make_mask(n, return_array=False, window_size=None)
            batch.update_and_fetch(keys, values)
            out = attention(batch, queries, mask)
            for i, s in enumerate(singles):
                s_mask = s.make_mask(n, return_array=False, window_size=None)
                s.update_and_fetch(keys[i : i + 1], values[i : i + 1])
                single = attention(s, queries[i : i + 1], s_mask)
                assert mx.array_equal(out[i : i + 1], single).item()  # bit for bit, here
    for i, s in enumerate(singles):  # and the codes themselves are the same
        row = batch.extract(i)
        for a, b in zip((*row.keys, *row.values), (*s.keys, *s.values), strict=True):
            assert mx.array_equal(a, b[..., : s.offset, :]).item()
