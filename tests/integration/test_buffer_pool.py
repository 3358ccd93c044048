"""MLX keeps freed KV-sized buffers for the next turn instead of faulting in fresh memory."""

from __future__ import annotations

import mlx.core as mx

from omlx.adapters.mlx.cache.memory import keep_freed_buffers


def test_a_freed_buffer_is_kept_for_reuse_and_a_larger_default_is_not_lowered() -> None:
    original = mx.set_cache_limit(0)
    try:
        mx.clear_cache()
        assert keep_freed_buffers(4 * 10**9) == 10**9  # a quarter of the KV limit
        a = mx.zeros((64, 1024, 1024 // 4))  # 64 MB, twice MLX's CPU default pool
        mx.eval(a)
        del a
        assert mx.get_cache_memory() >= 64 * 2**20
        mx.set_cache_limit(8 * 10**9)
        assert keep_freed_buffers(4 * 10**9) == 8 * 10**9  # Metal's larger default stays
        assert mx.set_cache_limit(0) == 8 * 10**9
    finally:
        mx.clear_cache()
        mx.set_cache_limit(original)
