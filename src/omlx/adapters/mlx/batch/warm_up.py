"""A tiny generation on the engine thread before the first request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from omlx.adapters.mlx.batch.sampling import Sampler, make_sampler


def warm_up(
    generator: Any,
    model: Any,
    token: int,
    greedy: Sampler,
    request_waiting: Callable[[], bool],
    new_cache: Callable[[], list[Any]] | None = None,
) -> bool:
    """Pay the one-time costs before a request does; True if a request cut it short.

    The costs: the weights' pages (safetensors are mapped, not read, until a forward pass
    touches them), MLX's compiled kernels (sampling, activations), the batcher's
    restored-cache and decode paths and their buffers. Two rows, one continuing a
    restored cache, one sampling at a temperature, each of two tokens and one generated.
    It stops at the first request that arrives (``request_waiting``): each step is a
    forward pass (~0.1 s for the default model on 2 CPU cores) and the whole of it costs
    more than the one-time costs it pays here (a 4- and a 12-token row, run to the end,
    made the first request after start-up 0.8-1 s slower). Nothing reaches the prefix
    cache, the metrics or a client. ``new_cache`` makes the rows' caches as the engine
    makes a request's (exact mode's quantized ones); None: mlx-lm's.
    """
    from mlx_lm.models.cache import make_prompt_cache

    restored = new_cache() if new_cache is not None else make_prompt_cache(model)
    model(mx.array([[token] * 2]), cache=restored)
    mx.eval([c.state for c in restored])
    uids = generator.insert_segments(
        [[[token] * 2], [[token] * 2]],
        max_tokens=[1, 1],
        caches=[restored, new_cache() if new_cache is not None else None],
        all_tokens=[[token] * 2, []],
        samplers=[greedy, make_sampler(0.7, 0.95, 20, seed=0)],
    )
    pending, interrupted = set(uids), False
    for _ in range(64):  # a bound: two rows of two tokens need a handful of steps
        if request_waiting():
            interrupted = True  # a request came: it goes first, the rows are dropped
            break
        _, generated = generator.next()
        pending -= {r.uid for r in generated if r.finish_reason is not None}
        if not pending:
            break
    generator.remove(list(pending))
    return interrupted
