"""What a library block may hold: KV pairs, mlx-lm caches' ``state``, and clear refusals.

Every supported entry comes back from disk as it went in (tuples as tuples, ints and
``None`` in place, each array's dtype, shape and values), and a fresh mlx-lm cache
takes it back as its ``state``. MLX is touched only on the caller's thread.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

from omlx.cache import CacheConfig, CacheFactory, PagedSSDCacheManager
from omlx.cache import layers as layer_codec
from tests.storage_checks import assert_cache_invariants

HASH = b"\x42" * 32


def _round_trip(tmp_path: Path, kv_data: list[Any], token_count: int = 64) -> list[Any]:
    """Save, close, reopen (an empty RAM tier), load: what the disk gives back."""
    with PagedSSDCacheManager(tmp_path, model_name="hybrid") as ssd:
        ssd.save_block(HASH, kv_data, token_count)
    with PagedSSDCacheManager(tmp_path, model_name="hybrid") as ssd:
        assert len(ssd.ram) == 0
        loaded = ssd.load_block(HASH)
        assert ssd.stats()["disk"]["hits"] == 1
    assert_cache_invariants(tmp_path)
    assert loaded is not None
    return loaded


def _assert_same(got: Any, want: Any, where: str = "kv_data") -> None:
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, mx.array):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), where
        assert mx.array_equal(got, want).item(), where
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def _rand(shape: tuple[int, ...], dtype: mx.Dtype = mx.float32, seed: int = 0) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(dtype)


def test_every_supported_entry_comes_back_as_it_went_in(tmp_path: Path) -> None:
    kv_data = [
        (_rand((1, 2, 8, 4), mx.bfloat16, 1), _rand((1, 2, 8, 4), mx.bfloat16, 2)),
        (_rand((1, 2, 8, 4), mx.float16, 3), _rand((1, 2, 8, 4), mx.float16, 4), 8),  # KVCache
        ([_rand((1, 3, 6), seed=5), None], None, mx.array([8], dtype=mx.int32)),  # ArraysCache
        [(_rand((1, 1, 8, 2), seed=6), _rand((1, 1, 8, 2), seed=7), 8), ([None], None, None)],
        (
            (mx.array([[1, 2]], dtype=mx.uint32), _rand((1, 2), seed=8), _rand((1, 2), seed=9)),
            (mx.array([[3, 4]], dtype=mx.uint32), _rand((1, 2), seed=10), _rand((1, 2), seed=11)),
            8,
            64,
            4,
        ),  # a QuantizedKVCache's (keys, values, offset, group_size, bits)
        (mx.zeros((0, 4), dtype=mx.float64), mx.array(7, dtype=mx.int64), mx.array([True, False])),
        [
            mx.array([255], dtype=mx.uint8),
            mx.array([-1], dtype=mx.int8),
            mx.array([2**40], dtype=mx.uint64),
        ],
    ]
    loaded = _round_trip(tmp_path, kv_data, token_count=8)
    assert isinstance(loaded, list)
    _assert_same(loaded, kv_data)


def test_real_mlx_lm_caches_take_their_state_back(tmp_path: Path) -> None:
    keys, values = _rand((1, 2, 5, 4), seed=1), _rand((1, 2, 5, 4), seed=2)
    kv = KVCache()
    kv.update_and_fetch(keys, values)
    window = RotatingKVCache(max_size=4, keep=0)
    window.update_and_fetch(keys, values)
    ssm = ArraysCache(2)
    ssm[0], ssm[1] = _rand((1, 3, 4), seed=3), _rand((1, 2, 4, 4), seed=4)
    both = CacheList(KVCache(), ArraysCache(1))
    both.caches[0].update_and_fetch(keys, values)
    both.caches[1][0] = _rand((1, 2), seed=5)
    caches = [kv, window, ssm, both]
    loaded = _round_trip(tmp_path, [c.state for c in caches], token_count=5)

    fresh = [
        KVCache(),
        RotatingKVCache(max_size=4, keep=0),
        ArraysCache(2),
        CacheList(KVCache(), ArraysCache(1)),
    ]
    for cache, state in zip(fresh, loaded, strict=True):
        cache.state = state
    for before, after in zip(caches, fresh, strict=True):
        _assert_same(after.state, before.state)
    assert fresh[0].offset == 5 and fresh[1].offset == 5
    k, _ = fresh[0].update_and_fetch(_rand((1, 2, 1, 4), seed=6), _rand((1, 2, 1, 4), seed=7))
    assert k.shape == (1, 2, 6, 4)  # a restored cache continues where it stopped


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("kv_data", "error", "message"),
    [
        ("not a list", TypeError, "kv_data must be a list"),
        ([], ValueError, "no layers"),
        ([mx.zeros((2,))], TypeError, r"kv_data\[0\]: a layer's entry is a \(keys, values\) tuple"),
        ([KVCache()], TypeError, r"kv_data\[0\]: .*KVCache \(pass its \.state\)"),
        ([(ArraysCache(2),)], TypeError, r"kv_data\[0\]\[0\]: an mlx-lm ArraysCache \(pass its"),
        (
            [(np.zeros(2), np.zeros(2))],
            TypeError,
            r"kv_data\[0\]\[0\]: a numpy array \(wrap it in mx\.array\)",
        ),
        ([(mx.zeros((2,)), mx.array([1j]))], ValueError, r"kv_data\[0\]\[1\]: dtype .*complex64"),
        ([(mx.zeros((2,)), {"k": 1})], TypeError, r"kv_data\[0\]\[1\]: a dict cannot be stored"),
        ([(mx.zeros((2,)), b"meta")], TypeError, r"kv_data\[0\]\[1\]: a bytes"),
        ([(mx.zeros((2,)), 1.5)], TypeError, r"kv_data\[0\]\[1\]: a float"),
        ([(mx.zeros((2,)), True)], TypeError, r"kv_data\[0\]\[1\]: a bool"),
        (
            [(mx.zeros((2,)), mx.zeros((2,))), (_Opaque(),)],
            TypeError,
            r"kv_data\[1\]\[0\]: a _Opaque",
        ),
        ([[[[[[[[[[[[mx.zeros((1,))]]]]]]]]]]]], ValueError, "nests deeper"),
    ],
)
def test_what_cannot_be_stored_is_refused_naming_the_entry(
    kv_data: Any, error: type[Exception], message: str
) -> None:
    ssd = PagedSSDCacheManager(hot_cache_only=True)
    with pytest.raises(error, match=message):
        ssd.save_block(HASH, kv_data, 64)
    assert not ssd.has_block(HASH)


@pytest.mark.parametrize(
    ("block_hash", "token_count", "error", "message"),
    [
        ("00" * 32, 64, TypeError, "block_hash must be bytes"),
        (b"", 64, ValueError, "1 to 32 bytes"),
        (b"x" * 33, 64, ValueError, "1 to 32 bytes"),
        (HASH, 65, ValueError, "block size 64"),
        (HASH, -1, ValueError, "block size 64"),
        (HASH, 64.0, TypeError, "token_count must be an int"),
    ],
)
def test_bad_hashes_and_token_counts_are_refused(
    block_hash: Any, token_count: Any, error: type[Exception], message: str
) -> None:
    ssd = PagedSSDCacheManager(hot_cache_only=True)
    with pytest.raises(error, match=message):
        ssd.save_block(block_hash, [(mx.zeros((1,)), mx.zeros((1,)))], token_count)


def test_a_block_holds_at_most_the_model_s_layers() -> None:
    cfg = CacheConfig(block_size=16)
    prefix = CacheFactory.create_prefix_cache(
        cfg, paged_cache=CacheFactory.create_paged_cache(cfg, num_layers=2)
    )
    pair = (mx.zeros((1,)), mx.zeros((1,)))
    with pytest.raises(ValueError, match="holds 3 layers; the model has 2"):
        prefix.save_block(HASH, [pair] * 3, token_count=16)
    prefix.save_block(HASH, [pair] * 2, token_count=16)
    assert len(prefix.load_block(HASH)) == 2

    class Model:  # an mlx-lm model's ``layers`` say the same when no paged cache does
        def __init__(self) -> None:
            self.layers = [object()]

    prefix = CacheFactory.create_prefix_cache(cfg, model=Model())
    with pytest.raises(ValueError, match="the model has 1"):
        prefix.save_block(HASH, [pair] * 2, token_count=16)


def test_saved_and_loaded_arrays_are_the_caller_s_own(tmp_path: Path) -> None:
    whole = _rand((1, 2, 32, 4), seed=1)
    block = [(whole[..., :16, :], whole[..., 16:, :])]  # slices of a larger buffer
    with PagedSSDCacheManager(tmp_path, model_name="own") as ssd:
        ssd.save_block(HASH, block, token_count=16)
        # The RAM tier counts a compact copy, not the whole buffer a slice keeps alive.
        assert ssd.stats()["ram"]["bytes"] == whole.nbytes
        first = ssd.load_block(HASH)
        first[0][0][...] = 0  # the caller writes into what it got back...
        block[0][1][...] = 0  # ...and into what it saved
        again = ssd.load_block(HASH)
        assert mx.array_equal(again[0][0], whole[..., :16, :]).item()
        assert mx.array_equal(again[0][1], whole[..., 16:, :]).item()


def test_mlx_runs_on_the_caller_s_thread_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: set[str] = set()
    for name in ("_tensor_of", "_array_of", "compact"):
        real = getattr(layer_codec, name)

        def spy(*args: Any, _real: Any = real) -> Any:
            seen.add(threading.current_thread().name)
            return _real(*args)

        monkeypatch.setattr(layer_codec, name, spy)
    # ``compact`` is imported by name; the others reach the spies through the module.
    monkeypatch.setattr("omlx.cache.paged_ssd_cache.compact", layer_codec.compact)
    caller = threading.current_thread().name
    _round_trip(tmp_path, [(_rand((1, 4)), _rand((1, 4)))])
    assert seen == {caller}
    assert len(seen) == 1 and caller == "MainThread"
