"""The KV codec for mlx-lm's plain ``KVCache``: cut caches into blocks and join them back.

Runs on the engine thread only: ``split`` materializes its slices there, and
``encode`` turns them into bytes so the writer thread never touches MLX.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from omlx.adapters.blockfiles.format import RawTensor, decode_block, encode_block
from omlx.domain.blocks import BlockMeta, DecodedBlock
from omlx.domain.keys import CACHE_FORMAT_VERSION

# safetensors dtype names; bf16 travels as raw uint16 because numpy has no bfloat16.
_TO_ST = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}
_FROM_ST = {"F32": (np.float32, None), "F16": (np.float16, None), "BF16": (np.uint16, mx.bfloat16)}


@dataclass(frozen=True, slots=True)
class KVBlock:
    """One block of every layer, stacked: arrays shaped (layers, 1, kv_heads, block_tokens, head_dim).

    Stacking makes cutting a block one copy instead of two per layer, which is
    what keeps the engine thread's cost per new block around a millisecond.
    """

    keys: mx.array
    values: mx.array
    nbytes: int

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
        return KVBlock(keys, values, keys.nbytes + values.nbytes)

    def assemble(self, payloads: Sequence[KVBlock]) -> list[KVCache]:
        layers = payloads[0].layer_count
        cache = []
        for layer in range(layers):
            c = KVCache()
            c.keys = mx.concatenate([p.keys[layer] for p in payloads], axis=2)
            c.values = mx.concatenate([p.values[layer] for p in payloads], axis=2)
            c.offset = c.keys.shape[2]
            cache.append(c)
        mx.eval([(c.keys, c.values) for c in cache])
        return cache

    def nbytes(self, payload: KVBlock) -> int:
        return payload.nbytes

    def encode(self, payload: KVBlock, tokens: Sequence[int], meta: BlockMeta) -> bytes:
        tensors = {"tokens": RawTensor("I32", (len(tokens),), np.asarray(tokens, np.int32).tobytes())}
        dtype = _TO_ST.get(payload.keys.dtype)
        if dtype is None:
            raise ValueError(f"KV dtype {payload.keys.dtype} is not supported by the block format")
        # Zero-copy views of the stacked arrays; encode_block copies each layer once.
        keys, values = _to_host(payload.keys), _to_host(payload.values)
        for i in range(payload.layer_count):
            tensors[f"k.{i}"] = RawTensor(dtype, keys.shape[1:], memoryview(keys[i]))
            tensors[f"v.{i}"] = RawTensor(dtype, values.shape[1:], memoryview(values[i]))
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
        tensors, metadata = decode_block(data)
        try:
            layers = int(metadata["layer_count"])
            tokens = np.frombuffer(tensors["tokens"].data, np.int32).tolist()
            keys = mx.stack([_from_raw(tensors[f"k.{i}"]) for i in range(layers)])
            values = mx.stack([_from_raw(tensors[f"v.{i}"]) for i in range(layers)])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"malformed block file: {exc}") from exc
        mx.eval(keys, values)
        return DecodedBlock(tuple(tokens), KVBlock(keys, values, keys.nbytes + values.nbytes), metadata)


def _to_host(array: mx.array) -> np.ndarray:
    """A zero-copy numpy view of an evaluated, contiguous array; bf16 as its raw uint16 bits."""
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
        mx.eval(array)
    return np.asarray(array)


def _from_raw(raw: RawTensor) -> mx.array:
    if raw.dtype not in _FROM_ST:
        raise ValueError(f"unsupported tensor dtype {raw.dtype}")
    np_dtype, view_as = _FROM_ST[raw.dtype]
    host = np.frombuffer(raw.data, np_dtype).reshape(raw.shape)
    array = mx.array(host)
    return array.view(view_as) if view_as is not None else array
