"""The KV codec for mlx-lm's plain ``KVCache``: cut caches into blocks and join them back.

Runs on the engine thread only: ``split`` materializes its slices there, and
``encode`` turns them into bytes so the writer thread never touches MLX. A block read
from disk stays in the file's bytes (``decode`` makes zero-copy numpy views), so a
restore copies the KV once into MLX: ``assemble`` gathers each layer's blocks on the
host (numpy; several times faster here than ``mx.concatenate``) and hands MLX one array.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from omlx.adapters.blockfiles.format import RawTensor, decode_block, encode_block, joined
from omlx.domain.blocks import BlockMeta, DecodedBlock
from omlx.domain.keys import CACHE_FORMAT_VERSION

# safetensors dtype names; bf16 travels as raw uint16 because numpy has no bfloat16.
_TO_ST = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}
_FROM_ST = {"F32": (np.float32, mx.float32), "F16": (np.float16, mx.float16), "BF16": (np.uint16, mx.bfloat16)}


@dataclass(frozen=True, slots=True)
class KVBlock:
    """One block of every layer, stacked: arrays shaped (layers, 1, kv_heads, block_tokens, head_dim).

    Stacking makes cutting a block one copy instead of two per layer, which is
    what keeps the engine thread's cost per new block around a millisecond. ``keys``
    and ``values`` are MLX arrays for a block cut from a live cache, numpy views of
    the file's bytes for one read from disk (bf16 as its uint16 bits); ``dtype`` is
    the KV dtype either way.
    """

    keys: mx.array | np.ndarray
    values: mx.array | np.ndarray
    nbytes: int
    dtype: mx.Dtype

    @property
    def layer_count(self) -> int:
        return self.keys.shape[0]


def cache_is_plain_kv(cache: Sequence[object]) -> bool:
    """Only plain ``KVCache`` layers can be cut into position blocks."""
    return all(type(layer) is KVCache for layer in cache)


class MLXKVCodec:
    """Implements the domain's ``KVCodec`` port for lists of ``KVCache``."""

    def split(self, cache: Sequence[KVCache], start: int, stop: int) -> KVBlock:
        if stop > cache[0].offset:  # slicing past the end would silently give a short block
            raise ValueError(f"block [{start}, {stop}) is past the cache's {cache[0].offset} tokens")
        keys = mx.stack([c.keys[..., start:stop, :] for c in cache])
        values = mx.stack([c.values[..., start:stop, :] for c in cache])
        mx.eval(keys, values)
        return KVBlock(keys, values, keys.nbytes + values.nbytes, keys.dtype)

    def assemble(self, payloads: Sequence[KVBlock]) -> list[KVCache]:
        dtype = payloads[0].dtype
        keys = [_to_host(p.keys) for p in payloads]
        values = [_to_host(p.values) for p in payloads]
        # One host buffer per side, reused by every layer: the gather stays in the CPU's
        # cache and MLX copies each layer out of it once.
        k_join, v_join = _join_buffer(keys), _join_buffer(values)
        cache = []
        for layer in range(payloads[0].layer_count):
            c = KVCache()
            c.keys = _from_host(np.concatenate([k[layer] for k in keys], axis=2, out=k_join), dtype)
            c.values = _from_host(np.concatenate([v[layer] for v in values], axis=2, out=v_join), dtype)
            c.offset = c.keys.shape[2]
            cache.append(c)
        mx.eval([(c.keys, c.values) for c in cache])
        return cache

    def truncate(self, payload: KVBlock, n: int) -> KVBlock:
        """The block's first ``n`` positions: a lazy slice (or view), copied by ``assemble``."""
        total = payload.keys.shape[3]
        if not 0 < n <= total:
            raise ValueError(f"cannot keep {n} of a block's {total} positions")
        if n == total:
            return payload
        keys, values = payload.keys[..., :n, :], payload.values[..., :n, :]
        return KVBlock(keys, values, payload.nbytes * n // total, payload.dtype)

    def nbytes(self, payload: KVBlock) -> int:
        return payload.nbytes

    def encode(self, payload: KVBlock, tokens: Sequence[int], meta: BlockMeta) -> bytes:
        tensors = {"tokens": RawTensor("I32", (len(tokens),), np.asarray(tokens, np.int32).tobytes())}
        dtype = _TO_ST.get(payload.dtype)
        if dtype is None:
            raise ValueError(f"KV dtype {payload.dtype} is not supported by the block format")
        # Zero-copy views of the stacked arrays; encode_block copies each layer once. All
        # keys, then all values: each side is one span that ``decode`` takes whole.
        for prefix, array in (("k", payload.keys), ("v", payload.values)):
            host = _to_host(array)
            for i in range(payload.layer_count):
                tensors[f"{prefix}.{i}"] = RawTensor(dtype, host.shape[1:], memoryview(host[i]))
        metadata = {
            "format_version": str(CACHE_FORMAT_VERSION),
            "namespace": meta.namespace,
            "key": meta.key,
            "parent_key": meta.parent_key,
            "token_count": str(meta.token_count),
            "layer_count": str(payload.layer_count),
        }
        return encode_block(tensors, metadata)

    def decode(self, data: bytes) -> DecodedBlock:
        """Parse a block file; its KV stays in ``data`` (zero-copy views) until ``assemble``."""
        tensors, metadata = decode_block(data)
        try:
            layers = int(metadata["layer_count"])
            tokens = np.frombuffer(tensors["tokens"].data, np.int32).tolist()
            keys, dtype = _stacked(data, [tensors[f"k.{i}"] for i in range(layers)])
            values, v_dtype = _stacked(data, [tensors[f"v.{i}"] for i in range(layers)])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"malformed block file: {exc}") from exc
        if v_dtype != dtype or keys.shape[:-1] != values.shape[:-1]:
            raise ValueError("malformed block file: keys and values do not match")
        block = KVBlock(keys, values, keys.nbytes + values.nbytes, dtype)
        return DecodedBlock(tuple(tokens), block, metadata)


def _to_host(array: mx.array | np.ndarray) -> np.ndarray:
    """A zero-copy numpy view (an MLX array evaluated here if lazy); bf16 as its uint16 bits."""
    if isinstance(array, np.ndarray):
        return array
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    mx.eval(array)
    return np.asarray(array)


def _join_buffer(blocks: list[np.ndarray]) -> np.ndarray:
    """Room for one layer of ``blocks`` joined along the token axis."""
    _, batch, heads, _, dim = blocks[0].shape
    return np.empty((batch, heads, sum(b.shape[3] for b in blocks), dim), blocks[0].dtype)


def _from_host(host: np.ndarray, dtype: mx.Dtype) -> mx.array:
    """One copy of ``host`` into MLX, reinterpreted as ``dtype`` (bf16 arrives as uint16)."""
    array = mx.array(host)
    return array.view(dtype) if dtype == mx.bfloat16 else array


def _stacked(data: bytes, layers: list[RawTensor]) -> tuple[np.ndarray, mx.Dtype]:
    """One side's per-layer tensors as one array (layers, ...) and their KV dtype.

    A zero-copy view when they lie back to back in layer order (as ``encode`` writes
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
