"""Per-request samplers for mlx-lm's batch generator.

A seeded request gets its own PRNG key so that its tokens do not depend on
what else runs in the batch; greedy requests share one sampler object so the
generator samples the whole batch in one call.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, greedy_sampler

Sampler = Callable[[mx.array], mx.array]


def make_sampler(
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    min_p: float = 0.0,
) -> Sampler:
    """Greedy when ``temperature`` is 0, else top-p/min-p/top-k filtered categorical sampling
    (mlx-lm's order)."""
    if temperature <= 0:
        return greedy_sampler
    key = mx.random.key(seed) if seed is not None else None

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        if 0 < top_p < 1.0:
            logprobs = apply_top_p(logprobs, top_p)
        if 0 < min_p <= 1.0:
            logprobs = apply_min_p(logprobs, min_p)
        if 0 < top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, top_k)
        scaled = logprobs * (1.0 / temperature)
        if key is None:
            return mx.random.categorical(scaled)
        key, sub = mx.random.split(key)
        return mx.random.categorical(scaled, key=sub)

    return sample
