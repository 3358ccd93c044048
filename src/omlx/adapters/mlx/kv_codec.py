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
    """One block of every layer: arrays shaped (1, kv_heads, block_tokens, head_dim)."""

    keys: tuple[mx.array, ...]
    values: tuple[mx.array, ...]
    nbytes: int


def cache_is_plain_kv(cache: Sequence[object]) -> bool:
    """Only plain ``KVCache`` layers can be cut into position blocks."""
    return all(type(layer) is KVCache for layer in cache)


class MLXKVCodec:
    """Implements the domain's ``KVCodec`` port for lists of ``KVCache``."""

    def split(self, cache: Sequence[KVCache], start: int, stop: int) -> KVBlock:
        if stop > cache[0].offset:  # slicing past the end would silently give a short block
            raise ValueError(f"block [{start}, {stop}) is past the cache's {cache[0].offset} tokens")
        keys = tuple(mx.contiguous(c.keys[..., start:stop, :]) for c in cache)
        values = tuple(mx.contiguous(c.values[..., start:stop, :]) for c in cache)
        mx.eval(keys, values)
        nbytes = sum(a.nbytes for a in keys) + sum(a.nbytes for a in values)
        return KVBlock(keys, values, nbytes)

    def assemble(self, payloads: Sequence[KVBlock]) -> list[KVCache]:
        layers = len(payloads[0].keys)
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
        for i, (k, v) in enumerate(zip(payload.keys, payload.values, strict=True)):
            tensors[f"k.{i}"] = _to_raw(k)
            tensors[f"v.{i}"] = _to_raw(v)
        metadata = {
            "format_version": str(CACHE_FORMAT_VERSION),
            "namespace": meta.namespace,
            "key": meta.key,
            "parent_key": meta.parent_key,
            "token_count": str(meta.token_count),
            "layer_count": str(len(payload.keys)),
        }
        return encode_block(tensors, metadata)

    def decode(self, data: bytes) -> DecodedBlock:
        tensors, metadata = decode_block(data)
        try:
            layers = int(metadata["layer_count"])
            tokens = np.frombuffer(tensors["tokens"].data, np.int32).tolist()
            keys = tuple(_from_raw(tensors[f"k.{i}"]) for i in range(layers))
            values = tuple(_from_raw(tensors[f"v.{i}"]) for i in range(layers))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"malformed block file: {exc}") from exc
        mx.eval(keys, values)
        nbytes = sum(a.nbytes for a in keys) + sum(a.nbytes for a in values)
        return DecodedBlock(tuple(tokens), KVBlock(keys, values, nbytes), metadata)


def _to_raw(array: mx.array) -> RawTensor:
    name = _TO_ST.get(array.dtype)
    if name is None:
        raise ValueError(f"KV dtype {array.dtype} is not supported by the block format")
    host = np.array(array.view(mx.uint16) if array.dtype == mx.bfloat16 else array, copy=False)
    return RawTensor(name, tuple(array.shape), host.tobytes())


def _from_raw(raw: RawTensor) -> mx.array:
    if raw.dtype not in _FROM_ST:
        raise ValueError(f"unsupported tensor dtype {raw.dtype}")
    np_dtype, view_as = _FROM_ST[raw.dtype]
    host = np.frombuffer(raw.data, np_dtype).reshape(raw.shape)
    array = mx.array(host)
    return array.view(view_as) if view_as is not None else array
