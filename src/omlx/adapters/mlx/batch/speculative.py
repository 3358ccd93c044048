"""Speculative decode steps: drafted tokens verified in one forward pass, same output.

A plain decode step feeds a row's next token ``y`` and samples the one after it. A
speculative step feeds ``y`` followed by ``k`` drafted tokens (``prompt_lookup`` or a
draft model, ``draft_model``) and reads the model's choice after each of them: drafts
are kept while they equal what the model itself picks, and the model's own pick at the
first difference (or after the last draft) comes free. Greedy rows keep exactly the
tokens plain decoding gives; sampled rows use speculative sampling (a draft ``d`` is kept
with probability ``p(d)`` under the row's own filtered, tempered distribution, else a
token is drawn from ``p`` without ``d``), which keeps each token's distribution.

The row's cache and token list then hold the fed positions the model agreed with; the
rejected drafts' positions are trimmed before anything can read them, so no block cut
from this cache (the engine cuts blocks as it hands tokens out) holds a rejected draft.

Where it applies (``SpeculativeSteps._plan``): rows whose first token is out (a
speculative step hands ``y`` out after the verify pass, which must not delay the first
token), plain attention caches (``BatchKVCache`` or exact mode's ``BatchQuantizedKVCache``,
trimmable alike; a hybrid's state layers
cannot be rolled back, a sliding window's buffer may have rotated), logits processors
that are stateless or rewindable (penalties, the grammar mask, the reasoning budget), and
at most ``max_rows`` rows: a batch's cache is trimmed as one, so every row keeps only as
many drafts as the row that accepted the fewest.

This is mlx-lm's ``GenerationBatch.next`` for several tokens per row: it keeps the same
per-row state (pending tokens, processor context, counts, stop matchers) through
``mlx_lm_private.decode``, and runs only where the engine may use mlx-lm's private state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import BatchKVCache

from omlx.adapters.mlx.batch.sampling import CategoricalSampler, is_greedy
from omlx.adapters.mlx.batch.speculation import RowRecord, Speculation
from omlx.adapters.mlx.mlx_lm_private import decode
from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import BatchQuantizedKVCache

log = logging.getLogger(__name__)

# Batch caches a refused draft is trimmed from (each forgets its newest positions alike).
_TRIMMABLE = (BatchKVCache, BatchQuantizedKVCache)


@dataclass(slots=True)
class _Plan:
    pending: list[int]  # each row's next token, not yet fed
    drafts: list[list[int]]
    started: float  # when the drafts' making began (the step's cost counts from there)


class SpeculativeSteps:
    """Mixed into a ``GenerationBatch`` class: ``next`` verifies drafts when it pays."""

    speculation: Speculation | None = None
    # Whether this batch evaluates each step before the next (the CPU's in-order steps):
    # then waiting for the pending token costs nothing. mlx-lm's pipelined steps (Metal,
    # CUDA) build the next pass while the last one runs; there a free proposer first
    # looks ahead from the tokens already out, and the step waits for the pending token
    # only when drafting would pay.
    in_order = False

    # What steps cost, for the policy. A plain step: on the in-order path the evaluation
    # of its pass (which ``_plan`` forces at the next step); on the pipelined path the
    # time between two calls over the same rows. A speculative step: from the drafts'
    # making to its tokens' evaluation. Neither counts the handing out of tokens, which
    # costs the same per token either way.
    _plain_before = False
    _last_call: float | None = None
    _last_rows: tuple[int, ...] = ()

    def next(self) -> list[Any]:
        spec = self.speculation
        if spec is None:
            return super().next()  # type: ignore[misc]
        if not self.in_order:
            self._time_pipelined_step(spec)
        plan = self._plan()
        self._plain_before = plan is None
        if plan is None:
            return super().next()  # type: ignore[misc]
        return self._speculate(plan)

    def _time_pipelined_step(self, spec: Speculation) -> None:
        batch: Any = self
        now = time.perf_counter()
        rows = tuple(batch.uids)
        same = self._last_call is not None and rows == self._last_rows
        if same and self._plain_before and 0 < len(rows) <= spec.config.max_rows:
            spec.policy.costs.observe_plain(now - self._last_call)
        self._last_call, self._last_rows = now, rows

    # ---- whether and what to draft ------------------------------------------------

    def _plan(self) -> _Plan | None:
        spec = self.speculation
        assert spec is not None
        batch: Any = self
        n = len(batch.uids)
        if not n or n > spec.config.max_rows:
            return None
        rows = [spec.row(uid) for uid in batch.uids]
        if any(r is None for r in rows) or any(decode.handed_out(batch, i) < 1 for i in range(n)):
            return None
        if not all(type(c) in _TRIMMABLE for c in batch.prompt_cache):
            return None
        if not all(_rewindable(p) for ps in batch.logits_processors for p in ps or ()):
            return None
        if not all(is_greedy(s) or isinstance(s, CategoricalSampler) for s in _samplers(batch)):
            return None
        free = spec.proposer.free
        if free and not self.in_order and not self._worth_waiting(spec, rows):
            return None
        started = time.perf_counter()
        pending_tokens = decode.pending_tokens(batch)
        mx.eval(pending_tokens)
        if self.in_order and self._plain_before:
            spec.policy.costs.observe_plain(time.perf_counter() - started)
        pending = pending_tokens.tolist()
        started = time.perf_counter()
        drafts = []
        for i, (uid, row) in enumerate(zip(batch.uids, rows, strict=True)):
            _settle(row, batch.tokens[i], pending[i])
            limit = _limit(spec, batch, i)
            if limit < 1:
                return None
            rate = row.acceptance.rate
            length = lambda available, rate=rate: spec.policy.length(rate, available)  # noqa: E731
            offered = spec.proposer.propose(
                uid, batch.tokens[i], pending[i], limit, _all if free else length
            )
            offered = offered[: _grammar_allows(batch.logits_processors[i], pending[i], offered)]
            draft = offered[: length(len(offered))] if free else offered
            if offered and not draft:
                # The token after ``pending`` (its index in the row's tokens, a step from now).
                row.guess = (len(batch.tokens[i]) + 1, offered[0])
            drafts.append(draft)
        if not all(drafts):
            # One row without drafts makes the step plain for all: the others' offers
            # are checked against what they pick instead.
            for i, (row, draft) in enumerate(zip(rows, drafts, strict=True)):
                if draft and free:
                    row.guess = (len(batch.tokens[i]) + 1, draft[0])
            return None
        return _Plan(pending, drafts, started)

    def _worth_waiting(self, spec: Speculation, rows: list[RowRecord]) -> bool:
        """Whether every row would draft, judged from the tokens already out (the pending
        token not awaited): the lookup's guess for the pending token is kept, to be
        checked against it once it is out."""
        batch: Any = self
        worth = True
        for i, (uid, row) in enumerate(zip(batch.uids, rows, strict=True)):
            tokens = batch.tokens[i]
            _settle(row, tokens, None)
            ahead = spec.proposer.propose(uid, tokens, None, _limit(spec, batch, i) + 1, _all)
            if len(ahead) < 2 or spec.policy.length(row.acceptance.rate, len(ahead) - 1) == 0:
                if ahead and row.guess is None:
                    row.guess = (len(tokens), ahead[0])
                worth = False
        return worth

    # ---- the verify step ----------------------------------------------------------

    def _speculate(self, plan: _Plan) -> list[Any]:
        batch: Any = self
        spec = self.speculation
        assert spec is not None
        width = max(len(d) for d in plan.drafts)
        inputs = [
            [y, *d, *[d[-1]] * (width - len(d))]
            for y, d in zip(plan.pending, plan.drafts, strict=True)
        ]
        logits = batch.model(mx.array(inputs), cache=batch.prompt_cache)
        marks, bases = self._before_processing()
        if any(batch.logits_processors):
            logits = self._processed(logits, inputs, plan.drafts, bases)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        accepted, chosen = [], []
        for i, draft in enumerate(plan.drafts):
            a, token = _verify(batch.samplers[i] if batch.samplers else None, logprobs[i], draft)
            accepted.append(a)
            chosen.append(token)
        kept = min(accepted)
        for c in batch.prompt_cache:
            c.trim(width - kept)
        nexts = [
            d[kept] if a > kept else t
            for d, a, t in zip(plan.drafts, accepted, chosen, strict=True)
        ]
        handed = [[y, *d[:kept]] for y, d in zip(plan.pending, plan.drafts, strict=True)]
        self._after_processing(marks, bases, handed)
        next_tokens = mx.array(nexts)
        next_logprobs = [logprobs[i, kept] for i in range(len(nexts))]
        previous = decode.replace_pending(batch, next_tokens, next_logprobs)
        mx.eval(next_tokens, next_logprobs, previous)
        for i, uid in enumerate(batch.uids):
            batch.tokens[i].extend(handed[i])
            row = spec.row(uid)
            row.acceptance.record(len(plan.drafts[i]), accepted[i])
            row.steps += 1
            row.drafted += len(plan.drafts[i])
            row.accepted += kept
        spec.policy.costs.observe(width, time.perf_counter() - plan.started)
        return self._responses(
            handed,
            [[previous[i], *(logprobs[i, j] for j in range(kept))] for i in range(len(handed))],
        )

    def _before_processing(self) -> tuple[list[list[Any]], list[int]]:
        """Each row's stateful processors' marks and its token buffer's size, before the step."""
        batch: Any = self
        marks, bases = [], []
        for i, processors in enumerate(batch.logits_processors):
            marks.append([p.mark() if hasattr(p, "mark") else None for p in processors or ()])
            bases.append(decode.context_size(batch, i))
        return marks, bases

    def _processed(
        self, logits: mx.array, inputs: list[list[int]], drafts: list[list[int]], bases: list[int]
    ) -> mx.array:
        """Each row's logits at each fed position after its processors, given the tokens
        up to that position (the grammar takes the drafts one by one)."""
        batch: Any = self
        rows = []
        for i, processors in enumerate(batch.logits_processors):
            if not processors:
                rows.append(logits[i])
                continue
            fed = len(drafts[i]) + 1
            context = decode.token_context(batch, i).update_and_fetch(mx.array(inputs[i][:fed]))
            positions = []
            for j in range(fed):
                row = logits[i : i + 1, j]
                for processor in processors:
                    row = processor(context[: bases[i] + 1 + j], row)
                positions.append(row)
            positions.extend(logits[i : i + 1, j] for j in range(fed, len(inputs[i])))
            rows.append(mx.concatenate(positions, axis=0))
        return mx.stack(rows)

    def _after_processing(
        self, marks: list[list[Any]], bases: list[int], handed: list[list[int]]
    ) -> None:
        """Processors and token buffers back to the tokens each row keeps."""
        batch: Any = self
        for i, processors in enumerate(batch.logits_processors):
            if not processors:
                continue
            decode.truncate_context(batch, i, bases[i] + len(handed[i]))
            for processor, mark in zip(processors, marks[i], strict=True):
                if mark is not None:
                    processor.rewind(mark, handed[i])

    # ---- handing tokens out ---------------------------------------------------------

    def _responses(self, handed: list[list[int]], logprobs: list[list[mx.array]]) -> list[Any]:
        """``GenerationBatch.next``'s bookkeeping, token by token: a row ends at its first
        stop token or at max_tokens, its cache cut there."""
        batch: Any = self
        responses, keep, finished = [], [], []
        for i, uid in enumerate(batch.uids):
            ended = False
            for h, token in enumerate(handed[i]):
                reason = decode.hand_out(batch, i, token)
                if reason is None:
                    responses.append(
                        GenerationBatch.Response(uid, token, logprobs[i][h], None, None, None)
                    )
                    continue
                unused = len(handed[i]) - 1 - h
                cache = batch.extract_cache(i)
                for layer in cache:
                    layer.trim(unused)
                finished.append(cache)
                tokens = batch.tokens[i][: len(batch.tokens[i]) - unused]
                responses.append(
                    GenerationBatch.Response(uid, token, logprobs[i][h], reason, cache, tokens)
                )
                ended = True
                break
            if not ended:
                keep.append(i)
        if finished:
            mx.eval([c.state for cache in finished for c in cache])
        if len(keep) < len(batch.uids):
            batch.filter(keep)
        return responses

    def filter(self, keep: list[int]) -> None:
        batch: Any = self
        if self.speculation is not None:
            kept = {batch.uids[i] for i in keep}
            for uid in batch.uids:
                if uid not in kept:
                    self.speculation.left_batch(uid)
        super().filter(keep)  # type: ignore[misc]


class SpeculativeInOrder(SpeculativeSteps, decode.InOrderGeneration):
    """In-order decode steps (the CPU's), speculative where it pays."""

    in_order = True


class SpeculativeGeneration(SpeculativeSteps, decode.HandingOverGeneration):
    """mlx-lm's pipelined decode steps (Metal, CUDA), speculative where it pays."""


def _all(available: int) -> int:
    return available


def _limit(spec: Speculation, batch: Any, i: int) -> int:
    """The most drafts row ``i`` may verify: the pending token is handed out with them,
    at most max_tokens in all."""
    return min(spec.config.max_draft, batch.max_tokens[i] - decode.handed_out(batch, i) - 1)


def _settle(row: RowRecord, tokens: Sequence[int], pending: int | None) -> None:
    """Score the row's guess against the model's token at its index, if that is out."""
    if row.guess is None:
        return
    index, token = row.guess
    if index < len(tokens):
        actual = tokens[index]
    elif index == len(tokens) and pending is not None:
        actual = pending
    else:
        return  # not out yet
    row.acceptance.record(1, int(actual == token))
    row.guess = None


def _samplers(batch: Any) -> list[Any]:
    return list(batch.samplers) if batch.samplers else [None] * len(batch.uids)


def _rewindable(processor: Any) -> bool:
    """Processors a speculative step can run ahead with: rewindable ones (``mark`` and
    ``rewind``) and mlx-lm's penalties and bias, functions of the tokens they are given."""
    if hasattr(processor, "rewind"):
        return True
    name = getattr(processor, "__name__", "")
    return name in _STATELESS


_STATELESS = {
    "logit_bias_processor",
    "repetition_penalty_processor",
    "presence_penalty_processor",
    "frequency_penalty_processor",
}


def _grammar_allows(processors: Sequence[Any] | None, pending: int, draft: list[int]) -> int:
    """How many drafts the row's grammar takes (all when it has none)."""
    allowed = len(draft)
    for processor in processors or ():
        if hasattr(processor, "admissible"):
            allowed = min(allowed, processor.admissible(pending, draft))
    return allowed


def _verify(sampler: Any, logprobs: mx.array, draft: list[int]) -> tuple[int, int]:
    """How many drafts a row keeps, and its token after them.

    ``logprobs[j]`` is the model's (processed) distribution after the j-th fed token.
    """
    m = len(draft)
    if is_greedy(sampler):
        picks = mx.argmax(logprobs[: m + 1], axis=-1).tolist()
        a = 0
        while a < m and picks[a] == draft[a]:
            a += 1
        return a, picks[a]
    return accept_sampled(sampler, logprobs[: m + 1], draft)


def accept_sampled(
    sampler: CategoricalSampler, logprobs: mx.array, draft: list[int]
) -> tuple[int, int]:
    """Speculative sampling with deterministic drafts: draft ``j`` is kept with probability
    ``p_j(d_j)``; at the first refusal a token is drawn from ``p_j`` with ``d_j`` taken out
    (renormalised), and after the last draft from ``p_m``. Each token so produced has the
    distribution ``p`` plain sampling draws from."""
    m = len(draft)
    weights = sampler.weights(logprobs)  # [m + 1, vocab], -inf where filtered out
    probs = mx.softmax(weights[:m], axis=-1)
    drafted = mx.array(draft)
    chances = mx.take_along_axis(probs, drafted[:, None], axis=-1)[:, 0]
    draws = mx.random.uniform(shape=(m,), key=sampler.next_key())
    kept = (draws < chances).tolist()
    a = kept.index(False) if False in kept else m
    row = weights[a]
    if a < m:
        row = mx.where(mx.arange(row.shape[-1]) == draft[a], -mx.inf, row)
    token = mx.random.categorical(row, key=sampler.next_key())
    return a, int(token.item())
