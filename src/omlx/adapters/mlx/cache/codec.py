"""The MLX codec: cut mlx-lm caches into stored objects and join objects back into caches.

One codec per model, over its ``ModelLayout`` (``cache_layout``): a small registry by
cache class decides what each leaf contributes. ``kv`` leaves give a block's KV,
``window`` leaves (sliding attention) a block's window KV, ``state`` leaves (SSM) a
snapshot; ``assemble`` rebuilds ``KVCache``, ``RotatingKVCache`` (offset and index set so
it continues as if it had seen every position), ``ArraysCache`` and ``CacheList`` entries.

Runs on the engine thread only: ``split`` materializes its slices there, and ``encode``
turns them into bytes so the writer thread never touches MLX. An object read from disk
stays in the file's bytes (``decode`` makes zero-copy numpy views), so a restore copies
the KV once into MLX: ``assemble`` gathers each layer's blocks on the host (numpy;
several times faster here than ``mx.concatenate``) and hands MLX one array.

With a ``KVQuant`` setting in ``store`` mode, ``split`` quantizes each block as it cuts
it (``kv_quantized``): the hot tier and the files keep the codes, ``assemble`` dequantizes.
In ``exact`` mode the running cache holds the codes already (``quantized_batch_cache``):
``split`` slices them, ``assemble`` puts them back into ``ExactKVCache``s as they are, and
layers that run in full precision (sliding windows; a head_dim the group size does not
divide) are stored in full precision, so that a hit equals a miss.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

from omlx.adapters.blockfiles.format import (
    RawTensor,
    block_metadata,
    encode_block,
    joined,
    kv_layers,
    pack_block,
    quant_parts,
    unpack_block,
)
from omlx.adapters.mlx.cache.join import dtype_of, from_host, join_leaves, to_host
from omlx.adapters.mlx.cache.layout import ModelLayout, flat_leaves, plain_layout
from omlx.adapters.mlx.cache.quantized import (
    QuantizedKVBlock,
    exact_block,
    quantizable,
    quantized_block,
)
from omlx.adapters.mlx.cache.restored_cache import with_room
from omlx.adapters.mlx.mlx_lm_private import rows
from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import ExactKVCache
from omlx.adapters.mlx.mlx_lm_private.rows import RowView
from omlx.domain.cache.blocks import BlockMeta, DecodedBlock
from omlx.domain.cache.keys import KV, STATE, WINDOW
from omlx.domain.cache.kv_quant import KVQuant

# safetensors dtype names; bf16 travels as raw uint16 because numpy has no bfloat16.
_TO_ST = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.uint32: "U32"}
_FROM_ST = {
    "U32": (np.uint32, mx.uint32),  # a quantized block's codes
    "F32": (np.float32, mx.float32),
    "F16": (np.float16, mx.float16),
    "BF16": (np.uint16, mx.bfloat16),
}


@dataclass(frozen=True, slots=True)
class KVBlock:
    """One block of some leaves, stacked: arrays shaped (leaves, 1, kv_heads, positions, head_dim).

    Stacking makes cutting a block one copy instead of two per layer. ``keys`` and
    ``values`` are MLX arrays for a block cut from a live cache, numpy views of the file's
    bytes for one read from disk (bf16 as its uint16 bits); ``dtype`` is the KV dtype
    either way. ``leaves`` are the layout's leaf indices the rows belong to.
    """

    keys: mx.array | np.ndarray
    values: mx.array | np.ndarray
    nbytes: int
    dtype: mx.Dtype
    leaves: tuple[int, ...] = ()

    @property
    def layer_count(self) -> int:
        return self.keys.shape[0]

    @property
    def positions(self) -> int:
        return self.keys.shape[3]


@dataclass(frozen=True, slots=True)
class Blocks:
    """One stored block of leaves whose shapes differ: a ``KVBlock`` per shape group."""

    groups: tuple[KVBlock | QuantizedKVBlock, ...]
    positions: int

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.groups)


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """The state leaves' arrays after a position: per leaf, its slots (None where empty)."""

    leaves: tuple[int, ...]
    arrays: tuple[tuple[Any, ...], ...]  # mx arrays, or (numpy view, mx dtype) read from disk
    nbytes: int


class MLXKVCodec:
    """Implements the domain's ``KVCodec`` port for one model's layout."""

    def __init__(self, layout: ModelLayout | None = None, kv_quant: KVQuant | None = None) -> None:
        self._layout = layout  # None: learned from the first cache (plain KV)
        self.kv_quant = kv_quant  # None: blocks in the model's KV dtype

    # ---- cutting (engine thread) --------------------------------------------------

    def split(self, cache: Any, start: int, stop: int) -> KVBlock | Blocks:
        """KV of the full-attention leaves for positions ``[start, stop)``."""
        return self._cut(cache, KV, start, stop)

    def split_window(self, cache: Any, start: int, stop: int) -> KVBlock | Blocks:
        """KV of the sliding-window leaves for positions ``[start, stop)``."""
        return self._cut(cache, WINDOW, start, stop)

    def snapshot(self, cache: Any) -> StateSnapshot:
        layers = self._leaf_layers(cache)
        leaves = tuple(self.layout(cache).of(STATE))
        arrays = tuple(tuple(rows.state_arrays(*layers[i])) for i in leaves)
        mx.eval([a for slots in arrays for a in slots if a is not None])
        nbytes = sum(a.nbytes for slots in arrays for a in slots if a is not None)
        return StateSnapshot(leaves, arrays, nbytes)

    def _cut(self, cache: Any, kind: str, start: int, stop: int) -> KVBlock | Blocks:
        layers = self._leaf_layers(cache)
        leaves = self.layout(cache).of(kind)
        if not leaves:  # no leaves of this kind (an all-SSM model's KV): tokens only
            return Blocks((), stop - start)
        slices = [rows.kv_slice(*layers[i], start, stop) for i in leaves]
        if isinstance(slices[0][0], tuple):  # exact mode: the running cache's own codes
            kv_dtype = layers[leaves[0]][0].kv_dtype
            return self._cut_codes(leaves, slices, stop - start, kv_dtype)
        groups = []
        for members in _shape_groups(leaves, slices):
            keys = mx.stack([slices[m][0] for m in members])
            values = mx.stack([slices[m][1] for m in members])
            groups.append((tuple(leaves[m] for m in members), keys, values))
        quant = self.kv_quant
        # Exact mode stores what ran in full precision as it is: a hit must equal a miss.
        store = quant is not None and not quant.exact
        if store and all(quantizable(k.shape[-1], quant) for _, k, _ in groups):
            blocks: tuple[Any, ...] = tuple(quantized_block(k, v, quant, lv) for lv, k, v in groups)
            mx.eval([(*b.keys, *b.values) for b in blocks])
        else:  # off, or a head_dim the group size does not divide: the KV dtype as it is
            mx.eval([(k, v) for _, k, v in groups])
            blocks = tuple(KVBlock(k, v, k.nbytes + v.nbytes, k.dtype, lv) for lv, k, v in groups)
        return _one(blocks, stop - start)

    def _cut_codes(
        self, leaves: list[int], slices: list[tuple[Any, Any]], positions: int, kv_dtype: Any
    ) -> KVBlock | Blocks:
        """Blocks of exact mode's quantized layers: their codes, scales and biases stacked."""
        if self.kv_quant is None or not self.kv_quant.exact:
            raise ValueError("a quantized running cache needs an exact-mode kv_quant codec")
        groups: dict[tuple, list[int]] = {}
        for m, (k, v) in enumerate(slices):
            groups.setdefault(tuple(c.shape for c in (*k, *v)), []).append(m)
        blocks = []
        for members in groups.values():
            keys = tuple(mx.stack([slices[m][0][c] for m in members]) for c in range(3))
            values = tuple(mx.stack([slices[m][1][c] for m in members]) for c in range(3))
            lv = tuple(leaves[m] for m in members)
            blocks.append(exact_block(keys, values, self.kv_quant, lv, kv_dtype))
        mx.eval([(*b.keys, *b.values) for b in blocks])
        return _one(tuple(blocks), positions)

    def layout(self, cache: Any = None) -> ModelLayout:
        if self._layout is None:
            n = len(cache.layers) if isinstance(cache, RowView) else len(cache)
            self._layout = plain_layout(n)
        return self._layout

    def _leaf_layers(self, cache: Any) -> list[tuple[Any, int | None]]:
        """(layer cache, batch row or None) of every leaf, in leaf order."""
        layout = self.layout(cache)
        entries, row = (cache.layers, cache.row) if isinstance(cache, RowView) else (cache, None)
        out = []
        for leaf in layout.leaves:
            layer = entries[leaf.path[0]]
            for j in leaf.path[1:]:
                layer = layer.caches[j]
            out.append((layer, row))
        return out

    # ---- joining ------------------------------------------------------------------

    def assemble(
        self,
        payloads: Sequence[Any],
        windows: Sequence[Any] = (),
        state: Any = None,
        room: int = 0,
    ) -> list[Any]:
        layout = self.layout()
        position = sum(p.positions for p in payloads)
        built: dict[int, Any] = {}
        # Plain KV leaves get ``room`` positions past the restored ones and a growth step
        # more for the first generated tokens, so the prefill that follows writes in place
        # instead of growing (copying) the cache (``restored_cache``). Exact mode's leaves
        # go back as the codes they were cut as (they grow as mlx-lm's quantized cache does).
        exact = self.kv_quant is not None and self.kv_quant.exact
        first = _groups(payloads[0]) if payloads else ()
        kv_dtypes = {leaf: g.dtype for g in first for leaf in g.leaves or range(g.layer_count)}
        spare = room + KVCache.step if room else 0
        for leaf_index, keys, values in join_leaves([_groups(p) for p in payloads], exact, spare):
            if isinstance(keys, tuple):  # exact mode: the codes go back as they were cut
                quant, dtype = self.kv_quant, kv_dtypes[leaf_index]
                built[leaf_index] = ExactKVCache.of(
                    keys, values, quant.group_size, quant.bits, dtype
                )
                continue
            built[leaf_index] = with_room(keys, values, position)
        window_rows = join_leaves([_groups(w) for w in windows]) if windows else []
        for leaf_index, keys, values in window_rows:
            size = layout.leaves[leaf_index].window
            keep = min(position, size, keys.shape[2])
            # The last ``keep`` positions in time order, the write index at their end and
            # the offset at the restore point: it goes on as if it had seen every position.
            c = RotatingKVCache(max_size=size, keep=0)
            window_keys = keys[..., keys.shape[2] - keep :, :]
            window_values = values[..., values.shape[2] - keep :, :]
            c.state = (window_keys, window_values, position, 0, size, keep)
            built[leaf_index] = c
        if state is not None:
            for leaf_index, slots in zip(state.leaves, state.arrays, strict=True):
                c = ArraysCache(len(slots))
                c.state = ([None if a is None else _to_mlx(a) for a in slots], None, None)
                built[leaf_index] = c
        missing = [i for i in range(len(layout.leaves)) if i not in built]
        if missing:
            raise ValueError(f"leaves {missing} have nothing to restore from")
        cache = [_rebuild(entry, built) for entry in layout.shape]
        mx.eval([c.state for c in flat_leaves(cache)])
        return cache

    def truncate(self, payload: Any, n: int) -> Any:
        """The block's first ``n`` positions: a lazy slice (or view), copied by ``assemble``."""
        total = payload.positions
        if not 0 < n <= total:
            raise ValueError(f"cannot keep {n} of a block's {total} positions")
        if n == total:
            return payload
        groups = tuple(
            g.first(n)
            if isinstance(g, QuantizedKVBlock)
            else KVBlock(
                g.keys[..., :n, :], g.values[..., :n, :], g.nbytes * n // total, g.dtype, g.leaves
            )
            for g in _groups(payload)
        )
        return _one(groups, n)

    def nbytes(self, payload: Any) -> int:
        return payload.nbytes

    # ---- bytes (engine thread encodes, the request path decodes) --------------------

    def encode(self, payload: Any, tokens: Sequence[int], meta: BlockMeta) -> bytes:
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
            return encode_block(tensors, block_metadata(meta, len(self.layout().leaves), **extra))
        groups = _groups(payload)
        if groups and isinstance(groups[0], QuantizedKVBlock):
            return self._encode_quantized(payload, groups, tokens, meta)
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
            layer_count=len(self.layout().leaves),
            positions=payload.positions,
        )

    def _encode_quantized(
        self, payload: Any, groups: tuple[Any, ...], tokens: Sequence[int], meta: BlockMeta
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
            layer_count=len(self.layout().leaves),
            positions=payload.positions,
            quant={
                "kv_bits": str(quant.bits),
                "kv_group_size": str(quant.group_size),
                "kv_dtype": _st_name(groups[0].dtype),
            },
            quant_parts=parts,
        )

    def decode(self, data: bytes) -> DecodedBlock:
        """Parse an object file; its arrays stay in ``data`` (zero-copy views) until ``assemble``."""
        try:
            tokens, tensors, metadata = unpack_block(data)
            if metadata.get("kind") == STATE:
                payload = _state_of(tensors, json.loads(metadata["state_slots"]))
            else:
                payload = _blocks_of(data, tensors, metadata)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"malformed block file: {exc}") from exc
        return DecodedBlock(tokens, payload, metadata)


# ---- helpers ---------------------------------------------------------------------------


def _one(groups: tuple[KVBlock, ...], positions: int) -> KVBlock | Blocks:
    return groups[0] if len(groups) == 1 else Blocks(groups, positions)


def _groups(payload: Any) -> tuple[Any, ...]:
    return payload.groups if isinstance(payload, Blocks) else (payload,)


def _shape_groups(leaves: list[int], slices: list[tuple[mx.array, mx.array]]) -> list[list[int]]:
    """Member indices of ``slices`` grouped by (keys shape, values shape, dtype), in order."""
    groups: dict[tuple, list[int]] = {}
    for m, (k, v) in enumerate(slices):
        groups.setdefault((k.shape, v.shape, k.dtype), []).append(m)
    return list(groups.values())


def _rebuild(entry: Any, built: dict[int, Any]) -> Any:
    if isinstance(entry, tuple):
        return CacheList(*(_rebuild(e, built) for e in entry))
    return built[entry]


def _st_name(dtype: mx.Dtype) -> str:
    name = _TO_ST.get(dtype)
    if name is None:
        raise ValueError(f"dtype {dtype} is not supported by the block format")
    return name


def _st_dtype(array: Any) -> str:
    return _st_name(array[1] if isinstance(array, tuple) else array.dtype)


def _to_mlx(array: Any) -> mx.array:
    if isinstance(array, tuple):
        return from_host(array[0], array[1])
    return array


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
    return _one(tuple(blocks), positions)


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
    return _one(tuple(blocks), positions)


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
