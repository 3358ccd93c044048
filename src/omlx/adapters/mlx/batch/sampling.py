"""Per-request samplers for mlx-lm's batch generator.

A seeded request gets its own PRNG key so that its tokens do not depend on
what else runs in the batch; greedy requests share one sampler object so the
generator samples the whole batch in one call.

A sampler also says what it samples from (``weights``: the filtered, tempered
log-weights), which speculative decoding needs to accept or reject a drafted token
with the right probability (``speculative.accept_sampled``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, greedy_sampler

Sampler = Callable[[mx.array], mx.array]


class CategoricalSampler:
    """Top-p, then min-p, then top-k filtered categorical sampling at ``temperature``
    (mlx-lm's order); seeded or from MLX's global generator."""

    def __init__(
        self,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        min_p: float = 0.0,
    ) -> None:
        self.temperature = temperature
        self.top_p, self.top_k, self.min_p = top_p, top_k, min_p
        self._key = mx.random.key(seed) if seed is not None else None

    def weights(self, logprobs: mx.array) -> mx.array:
        """Unnormalised log-weights of what a draw takes from (-inf where filtered out)."""
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if 0 < self.min_p <= 1.0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs * (1.0 / self.temperature)

    def next_key(self) -> mx.array | None:
        """A fresh key of this request's own stream, or None (MLX's global generator)."""
        if self._key is None:
            return None
        self._key, sub = mx.random.split(self._key)
        return sub

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.random.categorical(self.weights(logprobs), key=self.next_key())


def make_sampler(
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    min_p: float = 0.0,
) -> Sampler:
    """Greedy (mlx-lm's own ``greedy_sampler``) when ``temperature`` is 0, else a
    ``CategoricalSampler``."""
    if temperature <= 0:
        return greedy_sampler
    return CategoricalSampler(temperature, top_p, top_k, seed, min_p)


def is_greedy(sampler: Sampler | None) -> bool:
    """Whether a row samples greedily (no sampler: the batch's greedy fallback)."""
    return sampler is None or sampler is greedy_sampler


class SharedSamplers:
    """Each request's sampler: its own where it is seeded; otherwise one object per
    parameters, shared by every request that asks for them (unseeded samplers are
    stateless), so the batcher samples those rows in one call instead of row by row."""

    def __init__(self, limit: int = 64) -> None:
        self._limit = limit  # clients choose the floats: keep the memo small
        self._shared: dict[tuple[float, float, int, float], Sampler] = {}

    def of(self, params: Any) -> Sampler:
        if params.seed is not None:
            return make_sampler(
                params.temperature, params.top_p, params.top_k, params.seed, params.min_p
            )
        key = (
            (params.temperature, params.top_p, params.top_k, params.min_p)
            if params.temperature > 0
            else (0.0, 1.0, 0, 0.0)
        )
        sampler = self._shared.get(key)
        if sampler is None:
            if len(self._shared) >= self._limit:
                self._shared.clear()
            sampler = self._shared[key] = make_sampler(*key[:3], min_p=key[3])
        return sampler
