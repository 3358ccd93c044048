"""The model as the batcher calls it, for a model whose rows need their requests' plans.

An M-RoPE vision model places a row's tokens by the images of its request's prompt
(``vision.mrope``). mlx-lm's batcher calls ``model(tokens, cache=...)`` for a whole batch,
its rows reordered, joined and split as requests come and go, and keeps no position but
each row's cache offset. ``PlannedRows`` stands in for the model there: the engine gives
it each request's plan when the request joins (``track``, made from its prompt by the
model's ``position_plan``), and each forward pass learns which requests its rows run
from the batch whose caches it is given (``mlx_lm_private.batcher.uids_of``) and hands
the model their plans. A row's positions are then a function of its prompt and its
cache offset alone: any chunking, batch or restore point gives the same.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from omlx.adapters.mlx.mlx_lm_private import batcher


class PlannedRows:
    """``model`` with each forward pass's rows' plans (by the requests' batcher uids)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.generator: Any = None  # set by the engine once the batcher is built
        self._plans: dict[int, Any] = {}

    def plan(self, tokens: Any) -> Any:
        """A prompt's plan (before it joins: a prompt the model cannot plan never runs)."""
        return self.model.position_plan(tokens)

    def track(self, uid: int, plan: Any) -> None:
        self._plans[uid] = plan

    def forget(self, uid: int | None) -> None:
        self._plans.pop(uid, None)

    def clear(self) -> None:
        self._plans.clear()

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        uids = batcher.uids_of(self.generator, cache) if self.generator is not None else None
        if uids is None:
            raise RuntimeError("a forward pass on a cache of no batch: its rows are unknown")
        # A row without a plan is the warm-up's: text from its start, plain positions.
        return self.model(inputs, cache=cache, plans=[self._plans.get(u) for u in uids], **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)  # make_cache, layers, ... as the model has them
