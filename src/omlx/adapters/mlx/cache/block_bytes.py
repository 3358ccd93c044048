"""A cut block as the bytes of its file, and back (``blockfiles.format`` lays them out).

``encode`` runs on the engine thread and turns MLX arrays into bytes, so the writer thread
never touches MLX; ``decode`` leaves the arrays in the file's bytes (zero-copy numpy views)
until ``assemble`` copies them into MLX once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from omlx.adapters.blockfiles.format import (
    RawTensor,
    Unpacked,
    block_metadata,
    encode_block,
    joined,
    kv_layers,
    pack_block,
    quant_parts,
    unpack_block,
)
from omlx.adapters.mlx.cache.blocks import (
    Blocks,
    KVBlock,
    StateSnapshot,
    groups_of,
    one_or_groups,
)
from omlx.adapters.mlx.cache.join import dtype_of, to_host
from omlx.adapters.mlx.cache.quantized import QuantizedKVBlock
from omlx.domain.cache.blocks import BlockMeta, DecodedBlock
from omlx.domain.cache.keys import STATE
from omlx.domain.cache.kv_quant import KVQuant

# safetensors dtype names; bf16 travels as raw uint16 because numpy has no bfloat16.
_TO_ST = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.uint32: "U32"}
_FROM_ST = {
    "U32": (np.uint32, mx.uint32),  # a quantized block's codes
    "F32": (np.float32, mx.float32),
    "F16": (np.float16, mx.float16),
    "BF16": (np.uint16, mx.bfloat16),
}


def encode(payload: Any, tokens: Sequence[int], meta: BlockMeta, layer_count: int) -> bytes:
    """A cut block as its file's bytes (``layer_count``: the layout's leaves)."""
    if isinstance(payload, StateSnapshot):
        tensors = {
            "tokens": RawTensor("I32", (len(tokens),), np.asarray(tokens, np.int32).tobytes())
        }
        slots = []
        for leaf, arrays in zip(payload.leaves, payload.arrays, strict=True):
            slots.append([leaf, len(arrays)])
            for j, array in enumerate(arrays):
                if array is not None:
                    host = to_host(array)
                    tensors[f"s.{leaf}.{j}"] = RawTensor(
                        _st_dtype(array), host.shape, memoryview(host)
                    )
        extra = {"state_slots": json.dumps(slots)}
        return encode_block(tensors, block_metadata(meta, layer_count, **extra))
    groups = groups_of(payload)
    if groups and isinstance(groups[0], QuantizedKVBlock):
        return _encode_quantized(payload, groups, tokens, meta, layer_count)
    # Zero-copy views of the stacked arrays; encode_block copies each layer once.
    leaves: list[int] = []
    layers: list[tuple[RawTensor, RawTensor]] = []
    for g in groups:
        keys, values = to_host(g.keys), to_host(g.values)
        name = _st_name(g.dtype)
        for row, leaf in enumerate(g.leaves or range(g.layer_count)):
            leaves.append(leaf)
            layers.append(
                (
                    RawTensor(name, keys.shape[1:], memoryview(keys[row])),
                    RawTensor(name, values.shape[1:], memoryview(values[row])),
                )
            )
    return pack_block(
        meta,
        tokens,
        layers,
        leaves=leaves,
        layer_count=layer_count,
        positions=payload.positions,
    )


def _encode_quantized(
    payload: Any, groups: tuple[Any, ...], tokens: Sequence[int], meta: BlockMeta, layer_count: int
) -> bytes:
    """A quantized block through ``pack_block``: codes as the layers, scales and biases beside."""
    leaves: list[int] = []
    layers: list[tuple[RawTensor, RawTensor]] = []
    parts: list[tuple[RawTensor, RawTensor, RawTensor, RawTensor]] = []
    for g in groups:
        k = [(to_host(a), _st_name(dtype_of(a))) for a in g.keys]
        v = [(to_host(a), _st_name(dtype_of(a))) for a in g.values]
        for row, leaf in enumerate(g.leaves or range(g.layer_count)):
            leaves.append(leaf)
            k_t, k_s, k_b = (RawTensor(n, h.shape[1:], memoryview(h[row])) for h, n in k)
            v_t, v_s, v_b = (RawTensor(n, h.shape[1:], memoryview(h[row])) for h, n in v)
            layers.append((k_t, v_t))
            parts.append((k_s, k_b, v_s, v_b))
    quant = groups[0].quant
    return pack_block(
        meta,
        tokens,
        layers,
        leaves=leaves,
        layer_count=layer_count,
        positions=payload.positions,
        quant={
            "kv_bits": str(quant.bits),
            "kv_group_size": str(quant.group_size),
            "kv_dtype": _st_name(groups[0].dtype),
        },
        quant_parts=parts,
    )


def tensor_shapes(payload: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor ``encode`` would write for ``payload``: name -> (dtype, shape), nothing
    copied (the restore checks what it is about to join against the model's spec)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    if isinstance(payload, StateSnapshot):
        for leaf, arrays in zip(payload.leaves, payload.arrays, strict=True):
            for j, array in enumerate(arrays):
                if array is not None:
                    host = array[0] if isinstance(array, tuple) else array
                    out[f"s.{leaf}.{j}"] = (_st_dtype(array), tuple(host.shape))
        return out
    for g in groups_of(payload):
        if isinstance(g, QuantizedKVBlock):
            sides = {"k": g.keys[0], "k_scales": g.keys[1], "k_biases": g.keys[2]}
            sides |= {"v": g.values[0], "v_scales": g.values[1], "v_biases": g.values[2]}
            named = {n: (_st_name(dtype_of(a)), tuple(a.shape[1:])) for n, a in sides.items()}
        else:
            name = _st_name(g.dtype)
            named = {"k": (name, tuple(g.keys.shape[1:])), "v": (name, tuple(g.values.shape[1:]))}
        for leaf in g.leaves or range(g.layer_count):
            out.update((f"{n}.{leaf}", spec) for n, spec in named.items())
    return out


def decode(data: bytes) -> DecodedBlock:
    """Parse an object file; its arrays stay in ``data`` (zero-copy views) until ``assemble``."""
    try:
        parts = unpack_block(data)
    except ValueError as exc:
        raise ValueError(f"malformed block file: {exc}") from exc
    return decode_parts(data, parts)


def decode_parts(data: bytes, parts: Unpacked) -> DecodedBlock:
    """``decode`` of a file ``unpack_block`` has parsed already."""
    tokens, tensors, metadata = parts
    try:
        if metadata.get("kind") == STATE:
            payload = _state_of(tensors, json.loads(metadata["state_slots"]))
        else:
            payload = _blocks_of(data, tensors, metadata)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed block file: {exc}") from exc
    return DecodedBlock(tokens, payload, metadata)


def _st_name(dtype: mx.Dtype) -> str:
    name = _TO_ST.get(dtype)
    if name is None:
        raise ValueError(f"dtype {dtype} is not supported by the block format")
    return name


def _st_dtype(array: Any) -> str:
    return _st_name(array[1] if isinstance(array, tuple) else array.dtype)


def _blocks_of(
    data: bytes, tensors: dict[str, RawTensor], metadata: dict[str, str]
) -> KVBlock | Blocks:
    layers = kv_layers(tensors, metadata)
    positions = int(metadata["positions"])
    if not layers:  # a model without leaves of this kind: only the tokens are stored
        return Blocks((), positions)
    if "kv_bits" in metadata:
        return _quantized_of(data, tensors, metadata, layers, positions)
    groups: dict[tuple, list[int]] = {}
    for leaf, k, v in layers:
        groups.setdefault((k.shape, v.shape, k.dtype, v.dtype), []).append(leaf)
    blocks = []
    for members in groups.values():
        keys, dtype = _stacked(data, [tensors[f"k.{leaf}"] for leaf in members])
        values, v_dtype = _stacked(data, [tensors[f"v.{leaf}"] for leaf in members])
        if v_dtype != dtype or keys.shape[:-1] != values.shape[:-1] or keys.shape[3] != positions:
            raise ValueError("keys and values do not match")
        blocks.append(KVBlock(keys, values, keys.nbytes + values.nbytes, dtype, tuple(members)))
    return one_or_groups(tuple(blocks), positions)


def _quantized_of(
    data: bytes,
    tensors: dict[str, RawTensor],
    metadata: dict[str, str],
    layers: list[tuple[int, RawTensor, RawTensor]],
    positions: int,
) -> KVBlock | Blocks:
    """A quantized block's groups: codes, scales and biases per side as stacked host views."""
    quant = KVQuant(int(metadata["kv_bits"]), int(metadata["kv_group_size"]))
    dtype = _FROM_ST[metadata["kv_dtype"]][1]
    groups: dict[tuple, list[int]] = {}
    for leaf, k, v in layers:
        parts = quant_parts(tensors, leaf)
        shapes = (k.shape, v.shape, k.dtype, v.dtype, *((p.shape, p.dtype) for p in parts))
        groups.setdefault(shapes, []).append(leaf)
    blocks = []
    for members in groups.values():
        sides = []
        for side in ("k", "v"):
            names = (side, f"{side}_scales", f"{side}_biases")
            stacked = [_stacked(data, [tensors[f"{n}.{leaf}"] for leaf in members]) for n in names]
            (codes, c_dtype), (scales, _), (biases, _) = stacked
            if (
                c_dtype != mx.uint32
                or codes.shape[3] != positions
                or scales.shape != biases.shape
                or scales.shape[:-1] != codes.shape[:-1]
                or codes.shape[-1] * 32 != scales.shape[-1] * quant.group_size * quant.bits
            ):
                raise ValueError(f"quantized {side} of leaves {members} do not fit together")
            sides.append((codes, scales, biases))
        nbytes = sum(a.nbytes for side in sides for a in side)
        blocks.append(QuantizedKVBlock(sides[0], sides[1], nbytes, dtype, quant, tuple(members)))
    return one_or_groups(tuple(blocks), positions)


def _state_of(tensors: dict[str, RawTensor], slots: list[list[int]]) -> StateSnapshot:
    leaves, arrays, nbytes = [], [], 0
    for leaf, count in slots:
        row = []
        for j in range(count):
            t = tensors.get(f"s.{leaf}.{j}")
            if t is None:
                row.append(None)
                continue
            np_dtype, dtype = _FROM_ST[t.dtype]
            host = np.frombuffer(t.data, np_dtype).reshape(t.shape)
            nbytes += host.nbytes
            row.append((host, dtype))
        leaves.append(leaf)
        arrays.append(tuple(row))
    return StateSnapshot(tuple(leaves), tuple(arrays), nbytes)


def _stacked(data: bytes, layers: list[RawTensor]) -> tuple[np.ndarray, mx.Dtype]:
    """One side's per-leaf tensors as one array (leaves, ...) and their KV dtype.

    A zero-copy view when they lie back to back in leaf order (as ``encode`` writes
    them); any other order, still valid safetensors, is gathered into a new array.
    """
    if not layers:
        raise ValueError("a block has no layers")
    first = layers[0]
    if any(t.dtype != first.dtype or t.shape != first.shape for t in layers):
        raise ValueError("layers differ in dtype or shape")
    if first.dtype not in _FROM_ST or len(first.shape) != 4:
        raise ValueError(f"unsupported KV tensor {first.dtype} {first.shape}")
    np_dtype, dtype = _FROM_ST[first.dtype]
    span = joined(data, layers)
    if span is not None:
        host = np.frombuffer(span, np_dtype).reshape(len(layers), *first.shape)
    else:
        host = np.stack([np.frombuffer(t.data, np_dtype).reshape(first.shape) for t in layers])
    return host, dtype
