"""A batcher whose last short prefill chunk also gives the request's first token.

mlx-lm's ``BatchGenerator`` keeps a prompt's last token as a segment of its own and runs
it as a forward pass of its own, after the chunk before it: a follow-up turn's ~40-token
tail costs two passes over the whole context instead of one. Measured on the default
model and 2 CPU cores over a 2,100-token context: a 30-token chunk then the last token
0.84-1.08 s, the 31 tokens in one call 0.70-0.93 s (the second pass alone 0.17-0.21 s).

``FusingBatchGenerator`` runs such a final chunk with its last token and samples the
first token from that call's logits (the same tokens; the chunk's KV differs from the
unfused order's in the last bits, as any other chunk size would). Only where it pays
and the cache's restore points allow it:

- chunks of at most ``FUSE_MAX_TOKENS`` in that step: mlx-lm models return the logits of
  every position, so the head runs over the whole chunk (31 x 49k for a 31-token tail;
  for a 256-token chunk it costs more than the pass it saves);
- plain attention layouts (``fuse=False`` otherwise): a hybrid or sliding-window model's
  restore points are captured at the end of the chunk, before the last token, and the
  state there exists only in the unfused order.

How, over mlx-lm's own loop (``BatchGenerator._next`` runs unchanged, then a hook):

1. the prompt batch's public ``prompt`` is given each step's chunks; for a row whose
   chunk is its final one it appends the last token and keeps that position's logits;
2. after the step, those rows leave the prefill batch the way mlx-lm's own rows do
   (``split``, then ``generate`` with the last token) except that ``generate`` is given
   a model that hands back the kept logits instead of running a pass.

The private state this needs (two batch objects, the prefill progress list, the hook
after ``_next``) is reached through ``mlx_lm_private``; the engine builds this batcher only
where it may use that state, and mlx-lm's own ``BatchGenerator`` elsewhere. A public
switch would remove the rest: were ``insert_segments`` able to keep the last token in its
final segment and ``PromptProcessingBatch.prompt`` to return the last position's logits,
rows whose prompt ends in a chunk could start decoding from them in ``_next`` itself, and
this module would be a constructor argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import PromptProcessingBatch

from omlx.adapters.mlx.batch.speculation import Speculation
from omlx.adapters.mlx.batch.speculative import SpeculativeGeneration, SpeculativeInOrder
from omlx.adapters.mlx.mlx_lm_private import batcher
from omlx.adapters.mlx.mlx_lm_private.batcher import HookedBatchGenerator, SplitRememberingBatch
from omlx.adapters.mlx.mlx_lm_private.decode import HandingOverGeneration, InOrderGeneration

FUSE_MAX_TOKENS = 64


@dataclass
class FusedResponse(PromptProcessingBatch.Response):
    """The end of a prompt whose last token ran with its final chunk: the row decodes now."""

    fused: bool = True


@dataclass(slots=True)
class _Tail:
    """A row still prefilling that may fuse: tokens before its last one, and the last one."""

    before_last: int
    last: int


class _FusionPlan:
    """Which rows' final chunk takes their last token along, and the logits that left."""

    def __init__(self, step_size: int) -> None:
        self.longest_fused_chunk = min(step_size, FUSE_MAX_TOKENS)
        self.tails: dict[int, _Tail] = {}  # uid -> the row's remaining prefill
        self.primed: dict[int, mx.array] = {}  # uid -> logits of its last prompt token

    def expect(self, uid: int, segments: list[list[int]]) -> None:
        """A new row; it may fuse only where mlx-lm cut its last token off a segment.

        A caller's own one-token final segment is a boundary it asked for: kept.
        """
        given = [s for s in segments if s]
        if given and len(given[-1]) > 1:
            self.tails[uid] = _Tail(sum(len(s) for s in given) - 1, given[-1][-1])

    def forget(self, uids: list[int]) -> None:
        for uid in uids:
            self.tails.pop(uid, None)
            self.primed.pop(uid, None)

    def choose(self, uids: list[int], chunks: list[list[int]]) -> list[int]:
        """The rows (indices) whose chunk this step is their final one and takes the last token.

        Every row's count of tokens left is kept here, whether or not this step fuses.
        """
        finishing = []
        for i, (uid, chunk) in enumerate(zip(uids, chunks, strict=True)):
            tail = self.tails.get(uid)
            if tail is None:
                continue
            tail.before_last -= len(chunk)
            if tail.before_last <= 0:
                finishing.append(i)
        # The head runs over every position of the step's call: only when all are short.
        short = max((len(c) for c in chunks), default=0) + 1 <= FUSE_MAX_TOKENS
        fused = [i for i in finishing if short and len(chunks[i]) + 1 <= self.longest_fused_chunk]
        for i in finishing:
            if i not in fused:
                self.tails.pop(uids[i])  # it ends the mlx-lm way: its last token alone
        return fused


class _FusingPromptBatch(SplitRememberingBatch):
    """A prompt batch whose ``prompt`` runs a row's final chunk with its last token (where
    the generator fuses), and that remembers what it split off (``batcher.uids_of``)."""

    plan: _FusionPlan | None = None  # set on the generator's batch (a split copy has none)

    def prompt(self, tokens: list[list[int]]) -> None:
        fused = self.plan.choose(self.uids, tokens) if self.plan is not None else []
        if not fused:
            super().prompt(tokens)
            return
        tails = {i: self.plan.tails.pop(self.uids[i]) for i in fused}
        tokens = [[*t, tails[i].last] if i in tails else t for i, t in enumerate(tokens)]
        keep = _KeepLastLogits(self.model, fused, [len(tokens[i]) - 1 for i in fused])
        self.model = keep
        try:
            super().prompt(tokens)  # one call: every chunk is shorter than the step
        finally:
            self.model = keep.model
        for e, i in enumerate(fused):
            self.plan.primed[self.uids[i]] = keep.last[e]


class _KeepLastLogits:
    """The model, keeping the logits of given rows at given positions (``prompt`` drops
    them), computed in one evaluation with the cache the call fills."""

    def __init__(self, model: Any, rows: list[int], positions: list[int]) -> None:
        self.model = model
        self.rows, self.positions = mx.array(rows), mx.array(positions)
        self.last: mx.array | None = None

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        logits = self.model(inputs, cache=cache)
        self.last = logits[self.rows, self.positions]
        mx.eval(self.last, [c.state for c in cache])  # ``prompt``'s own eval finds it done
        return logits


class _Replay:
    """Stands in for the model in ``generate``: the last token's logits, already computed."""

    def __init__(self, logits: mx.array) -> None:
        self.logits = logits

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        return self.logits[:, None, :]


class FusingBatchGenerator(HookedBatchGenerator):
    """``BatchGenerator`` that fuses a short final chunk with the prompt's last token, and
    decodes in order or speculatively where asked (omlx's own batch classes)."""

    def __init__(
        self,
        model: Any,
        *,
        fuse: bool = True,
        in_order: bool = False,
        speculation: Speculation | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.fuse = fuse
        self._plan = _FusionPlan(self.prefill_step_size)
        prompt = _FusingPromptBatch.empty(
            self.model, self.sampler, prefill_step_size=self.prefill_step_size
        )
        prompt.plan = self._plan if self.fuse else None
        if speculation is not None:
            kind = SpeculativeInOrder if in_order else SpeculativeGeneration
            generation = kind.empty(self.model, self.sampler)
            generation.speculation = speculation
        else:
            kind = InOrderGeneration if in_order else HandingOverGeneration
            generation = kind.empty(self.model, self.sampler)
        batcher.install_batches(self, prompt, generation)
        self.fused_rows = 0  # rows whose last token ran with their final chunk (tests, stats)

    def insert_segments(
        self, segments: list[list[list[int]]], *args: Any, **kwargs: Any
    ) -> list[int]:
        uids = super().insert_segments(segments, *args, **kwargs)
        if self.fuse:
            for uid, seq in zip(uids, segments, strict=True):
                self._plan.expect(uid, seq)
        return uids

    def remove(self, uids: list[int], return_prompt_caches: bool = False) -> Any:
        self._plan.forget(uids)
        return super().remove(uids, return_prompt_caches=return_prompt_caches)

    def after_step(self, prompt_responses: list[Any]) -> None:
        if self._plan.primed:
            self._start_decoding(prompt_responses)

    def _start_decoding(self, prompt_responses: list[Any]) -> None:
        """Move the rows whose last token ran this step to decoding, sampled from its logits."""
        primed, self._plan.primed = self._plan.primed, {}
        batch = batcher.prompt_batch(self)
        rows = [batch.uids.index(uid) for uid in primed]
        batcher.leave_prefill(self, rows)
        moved = batch.split(rows)
        moved.model = _Replay(mx.stack([primed[uid] for uid in moved.uids]))
        # ``generate`` appends each row's last token to the tokens its cache holds.
        lasts = [[tokens.pop()] for tokens in moved.tokens]
        batcher.generation_batch(self).extend(moved.generate(lasts))
        self.fused_rows += len(primed)
        for e, r in enumerate(prompt_responses):
            if r.uid in primed:
                total = r.progress[1]
                prompt_responses[e] = FusedResponse(r.uid, (total, total), True, True)
