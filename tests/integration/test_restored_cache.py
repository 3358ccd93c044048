"""A restored cache joins the batch without being copied: room past its offset, a lone row's
arrays handed over, the prefilled tail written in place, and the output unchanged."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import BatchKVCache, KVCache

from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.restored_cache import RestoredKVCache
from omlx.domain.cache.blocks import BlockMeta


def _filled(n: int, seed: int = 0) -> list[KVCache]:
    mx.random.seed(seed)
    caches = []
    for _ in range(2):
        c = KVCache()
        c.update_and_fetch(mx.random.normal((1, 2, n, 8)), mx.random.normal((1, 2, n, 8)))
        caches.append(c)
    mx.eval([c.state for c in caches])
    return caches


def _blocks(codec: MLXKVCodec, caches: list[KVCache], n: int, bs: int) -> list:
    payloads = []
    for i in range(n // bs):
        meta = BlockMeta(key=f"{i:064x}", parent_key="0" * 64, namespace="0" * 64, token_count=bs)
        data = codec.encode(codec.split(caches, i * bs, (i + 1) * bs), list(range(bs)), meta)
        payloads.append(codec.decode(bytes(data)).payload)
    return payloads


def test_assemble_leaves_room_and_a_lone_row_merges_without_a_copy() -> None:
    caches = _filled(128)
    codec = MLXKVCodec()
    codec.split(caches, 0, 64)  # a fresh codec learns the layout from its first cut
    restored = codec.assemble(_blocks(codec, caches, 128, 64), room=40)
    layer = restored[0]
    assert isinstance(layer, RestoredKVCache) and layer.offset == 128
    assert layer.keys.shape[2] == 128 + 40 + KVCache.step  # the tail, and a step to decode into
    assert mx.array_equal(layer.keys[..., :128, :], caches[0].keys[..., :128, :])
    assert mx.array_equal(layer.state[0][..., :128, :], caches[0].keys[..., :128, :])
    keys = layer.keys
    (batch,) = _merge_caches([[layer]])
    assert batch.keys is keys and layer.keys is None  # handed over, not copied
    assert batch._idx == 128 and batch.offset.tolist() == [128]
    # Prefilling the tail fits in the room: the batch cache does not grow.
    new_k, new_v = mx.ones((1, 2, 40, 8)), mx.ones((1, 2, 40, 8))
    k, v = batch.update_and_fetch(new_k, new_v)
    assert batch.keys.shape[2] == 128 + 40 + KVCache.step
    assert mx.array_equal(k[..., :128, :], caches[0].keys[..., :128, :])
    assert mx.array_equal(k[..., 128:, :], new_k)
    # The same result as mlx-lm's own merge of a plain cache, grown by the same tail.
    plain = KVCache()
    plain.state = (caches[0].keys[..., :128, :], caches[0].values[..., :128, :], 128)
    reference = BatchKVCache.merge([plain])
    rk, rv = reference.update_and_fetch(new_k, new_v)
    assert mx.array_equal(k, rk) and mx.array_equal(v, rv)


def test_several_rows_merge_as_mlx_lm_merges_them() -> None:
    a, b = _filled(64, seed=1)[0], _filled(32, seed=2)[0]
    rows = []
    for c in (a, b):
        r = RestoredKVCache()
        r.state = (c.keys, c.values, c.offset)
        rows.append(r)
    merged = rows[0].merge(rows)
    reference = BatchKVCache.merge([a, b])
    assert mx.array_equal(merged.keys, reference.keys)
    assert merged.left_padding.tolist() == [0, 32]
