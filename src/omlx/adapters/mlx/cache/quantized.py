"""Quantized KV blocks (``kv_bits``): mlx's affine codes, scales and biases per stacked side.

A block cut with quantization on holds each side (keys, values) as the triple
``mx.quantize`` returns over head_dim: uint32 codes, then one scale and one bias per
group. For float32 KV the scales and biases are kept as float16: with float32 ones an
8-bit block would be 0.281x float32 (over the 0.28x target), and the float16 rounding of a
scale is ~20x finer than the 8-bit code step (docs/benchmarks.md has the measured cost).
Joining blocks gathers each component on the host, then MLX dequantizes once per leaf.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from omlx.domain.cache.kv_quant import KVQuant

Side = tuple[mx.array | np.ndarray, mx.array | np.ndarray, mx.array | np.ndarray]


@dataclass(frozen=True, slots=True)
class QuantizedKVBlock:
    """One block of some leaves, quantized: each side ``(codes, scales, biases)``, stacked.

    Every component is shaped (leaves, 1, kv_heads, positions, ...): MLX arrays when cut
    from a live cache, numpy views of the file's bytes when read (bf16 as uint16 bits).
    ``dtype`` is the KV dtype a restore dequantizes to.
    """

    keys: Side
    values: Side
    nbytes: int
    dtype: mx.Dtype
    quant: KVQuant
    leaves: tuple[int, ...] = ()

    @property
    def layer_count(self) -> int:
        return self.keys[0].shape[0]

    @property
    def positions(self) -> int:
        return self.keys[0].shape[3]

    def first(self, n: int) -> QuantizedKVBlock:
        """Its first ``n`` positions (lazy slices or views): codes, scales and biases alike."""
        keys = tuple(c[..., :n, :] for c in self.keys)
        values = tuple(c[..., :n, :] for c in self.values)
        nbytes = self.nbytes * n // self.positions
        return QuantizedKVBlock(keys, values, nbytes, self.dtype, self.quant, self.leaves)


def gpu_backend() -> bool:
    """Whether mlx runs on a GPU here (Metal or CUDA): ``kv_mode = auto`` is exact there."""
    return mx.default_device().type == mx.gpu


def quantizable(head_dim: int, quant: KVQuant) -> bool:
    """Whether ``mx.quantize`` can group ``head_dim`` by the setting's group size."""
    return head_dim % quant.group_size == 0


def quantize_side(stacked: mx.array, quant: KVQuant) -> tuple[mx.array, mx.array, mx.array]:
    """``stacked`` (leaves, 1, heads, positions, head_dim) as codes, scales, biases."""
    codes, scales, biases = mx.quantize(stacked, group_size=quant.group_size, bits=quant.bits)
    if stacked.dtype == mx.float32:
        scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    return codes, scales, biases


def dequantize_side(
    codes: mx.array, scales: mx.array, biases: mx.array, quant: KVQuant, dtype: mx.Dtype
) -> mx.array:
    """The inverse of ``quantize_side``, in ``dtype``."""
    if scales.dtype != dtype:
        scales, biases = scales.astype(dtype), biases.astype(dtype)
    out = mx.dequantize(codes, scales, biases, group_size=quant.group_size, bits=quant.bits)
    return out if out.dtype == dtype else out.astype(dtype)


def exact_block(
    keys: tuple[mx.array, mx.array, mx.array],
    values: tuple[mx.array, mx.array, mx.array],
    quant: KVQuant,
    leaves: tuple[int, ...],
    dtype: mx.Dtype,
) -> QuantizedKVBlock:
    """A block of exact mode's running codes, stacked, of KV in ``dtype``: stored as
    ``quantized_block`` stores, since the running cache holds scales and biases as blocks
    do (``mlx_lm_private.quantized_batch_cache.scale_dtype``)."""
    nbytes = sum(a.nbytes for a in (*keys, *values))
    return QuantizedKVBlock(keys, values, nbytes, dtype, quant, leaves)


def quantized_block(
    keys: mx.array, values: mx.array, quant: KVQuant, leaves: tuple[int, ...]
) -> QuantizedKVBlock:
    """A stacked block quantized; its arrays evaluated by the caller (one ``mx.eval``)."""
    k, v = quantize_side(keys, quant), quantize_side(values, quant)
    nbytes = sum(a.nbytes for a in (*k, *v))
    return QuantizedKVBlock(k, v, nbytes, keys.dtype, quant, leaves)
