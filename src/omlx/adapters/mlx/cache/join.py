"""Joining blocks back into one cache: each leaf's blocks gathered on the host, one copy into MLX.

Numpy gathers a leaf's blocks along positions (several times faster here than
``mx.concatenate``) into one buffer per side, reused by every leaf, and MLX copies each
leaf out of it once; quantized blocks are joined component by component, then
dequantized (store mode) or handed over as codes (exact mode). ``room`` leaves zeroed
positions after the joined ones for the tokens a request prefills next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from omlx.adapters.mlx.cache.quantized import QuantizedKVBlock, dequantize_side


def join_leaves(
    payload_groups: Sequence[tuple[Any, ...]], exact: bool = False, room: int = 0
) -> list[tuple[int, Any, Any]]:
    """Each leaf's blocks (``payload_groups``: each block's groups, in order) joined along positions: (leaf, keys, values) as MLX arrays (exact
    mode's quantized leaves: (codes, scales, biases) per side).

    ``room``: zeroed positions after the joined ones (only the restored positions are KV);
    not for exact mode's codes.
    """
    first = payload_groups[0]
    out = []
    for g_index, group in enumerate(first):
        if isinstance(group, QuantizedKVBlock):
            out.extend(_joined_quantized([g[g_index] for g in payload_groups], exact, room))
            continue
        keys = [to_host(g[g_index].keys) for g in payload_groups]
        values = [to_host(g[g_index].values) for g in payload_groups]
        # One host buffer per side, reused by every leaf: the gather stays in the CPU's
        # cache and MLX copies each leaf out of it once.
        k_join, v_join = _join_buffer(keys, room), _join_buffer(values, room)
        held = k_join.shape[2] - room
        for row, leaf in enumerate(group.leaves or range(group.layer_count)):
            np.concatenate([k[row] for k in keys], axis=2, out=k_join[:, :, :held])
            np.concatenate([v[row] for v in values], axis=2, out=v_join[:, :, :held])
            out.append((leaf, from_host(k_join, group.dtype), from_host(v_join, group.dtype)))
    return out


def _joined_quantized(
    blocks: list[QuantizedKVBlock], exact: bool, room: int = 0
) -> list[tuple[int, Any, Any]]:
    """One group's quantized blocks joined per leaf on the host, then dequantized by MLX
    (``exact``: kept as codes, scales and biases in the running cache's dtype; else
    ``room``: zeroed positions after them, as ``join_leaves``)."""
    group = blocks[0]
    sides = []
    for side in ("keys", "values"):
        components = []
        for c in range(3):
            hosts = [to_host(getattr(b, side)[c]) for b in blocks]
            components.append((hosts, _join_buffer(hosts), dtype_of(getattr(group, side)[c])))
        sides.append(components)
    out = []
    for row, leaf in enumerate(group.leaves or range(group.layer_count)):
        restored = []
        for components in sides:
            arrays = [
                from_host(np.concatenate([h[row] for h in hosts], axis=2, out=buffer), dtype)
                for hosts, buffer, dtype in components
            ]
            if exact:  # as the running cache holds them: no cast, no dequantize
                restored.append(tuple(arrays))
                continue
            side = dequantize_side(*arrays, group.quant, group.dtype)
            if room:
                pad = mx.zeros((*side.shape[:2], room, side.shape[3]), side.dtype)
                side = mx.concatenate([side, pad], axis=2)
            restored.append(side)
        out.append((leaf, restored[0], restored[1]))
    return out


# A quantized component read from a file: its numpy dtype names its MLX one (scales and
# biases are never integers, so uint16 is bf16's bits).
_MX_OF_NP = {
    np.dtype(np.uint32): mx.uint32,
    np.dtype(np.float32): mx.float32,
    np.dtype(np.float16): mx.float16,
    np.dtype(np.uint16): mx.bfloat16,
}


def dtype_of(array: Any) -> mx.Dtype:
    """The MLX dtype of a live component or of one read from a file (a numpy view)."""
    return _MX_OF_NP[array.dtype] if isinstance(array, np.ndarray) else array.dtype


def to_host(array: Any) -> np.ndarray:
    """A zero-copy numpy view (an MLX array evaluated here if lazy); bf16 as its uint16 bits."""
    if isinstance(array, tuple):  # (numpy view, dtype) read from disk
        return array[0]
    if isinstance(array, np.ndarray):
        return array
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    mx.eval(array)
    return np.asarray(array)


def _join_buffer(blocks: list[np.ndarray], room: int = 0) -> np.ndarray:
    """Space for one leaf of ``blocks`` joined along the position axis, and ``room`` zeros after."""
    _, batch, heads, _, dim = blocks[0].shape
    held = sum(b.shape[3] for b in blocks)
    buffer = np.empty((batch, heads, held + room, dim), blocks[0].dtype)
    buffer[:, :, held:] = 0
    return buffer


def from_host(host: np.ndarray, dtype: mx.Dtype) -> mx.array:
    """One copy of ``host`` into MLX, reinterpreted as ``dtype`` (bf16 arrives as uint16)."""
    array = mx.array(host)
    return array.view(dtype) if dtype == mx.bfloat16 else array
