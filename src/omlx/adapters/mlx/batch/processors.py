"""Per-request logits processors for mlx-lm's batcher, and log-probabilities of a step.

mlx-lm calls a row's processors with the tokens in its cache (prompt, then generated) and
that row's logits, before the sampler: penalties come from mlx-lm itself, the grammar mask
from the request's ``TokenConstraint``. Rows without processors skip the per-row path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import make_logits_processors

from omlx.domain.cache.image_keys import IMAGE_ID_BASE
from omlx.domain.generation import GenerationRequest, ReasoningBudget, TokenLogprob

log = logging.getLogger(__name__)

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


class GrammarMask:
    """Masks one row's logits to the tokens its grammar allows next.

    The first call comes with the prompt only; each later one brings the token sampled
    at the step before, which the grammar takes before the next mask is computed (that
    read waits for the step: constrained rows give up one step of overlap). A grammar
    that refuses a token (a limit of the grammar engine, such as a schema with thousands
    of alternatives, or a bug) ends the row: only end-of-sequence is allowed from then
    on, and ``finish_reason`` says the answer is cut short (``grammar_finish_reason``).
    """

    def __init__(self, constraint: Any, eos_token_ids: Sequence[int]) -> None:
        self._constraint = constraint
        self._eos = list(eos_token_ids)
        self._words = np.zeros((constraint.vocab_size + 31) // 32, dtype=np.int32)
        self._started = False
        self._failed = False
        self._consumed = 0  # tokens the grammar took (speculative steps roll some back)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._started and not self._failed:
            self._failed = not self._constraint.advance(int(tokens[-1].item()))
            self._consumed += not self._failed
        self._started = True
        width = logits.shape[-1]
        if self._failed:
            allowed = np.zeros(width, dtype=np.bool_)
            allowed[[t for t in self._eos if t < width]] = True
        else:
            self._constraint.fill_bitmask(self._words)
            bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
            allowed = np.zeros(width, dtype=np.bool_)
            n = min(width, bits.size)
            allowed[:n] = bits[:n]
        return mx.where(mx.array(allowed), logits, -mx.inf)

    # ---- speculative steps (``speculative.SpeculativeSteps``) ----------------------

    def admissible(self, pending: int, drafts: list[int]) -> int:
        """How many of ``drafts`` the grammar allows after ``pending`` (the token this row
        feeds next, which its mask allowed): drafts past that would be refused."""
        if not self._started or self._failed or not drafts:
            return 0
        return max(self._constraint.validate([pending, *drafts]) - 1, 0)

    def mark(self) -> int:
        return self._consumed

    def rewind(self, mark: int, kept: list[int]) -> None:
        """Undo what a speculative step consumed past ``kept`` (the tokens the row keeps)."""
        extra = self._consumed - mark - len(kept)
        if extra > 0 and not self._failed:
            self._constraint.rollback(extra)
            self._consumed -= extra


class BudgetEnforcer:
    """Counts a row's reasoning tokens; once ``budget.tokens`` are spent, forces the end marker.

    The section opens with the start marker's tokens (or at once when the prompt opened
    it) and ends with the end marker's, written by the model or forced here token by token.
    """

    def __init__(self, budget: ReasoningBudget) -> None:
        self._budget = budget
        self._state = "thinking" if budget.opened else "before"
        self._recent: list[int] = []
        self._spent = 0
        self._forced = 0  # end-marker tokens forced so far
        self._started = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._started and self._state != "after":
            self._see(int(tokens[-1].item()))
        self._started = True
        if self._state != "forcing":
            return logits
        allowed = np.zeros(logits.shape[-1], dtype=np.bool_)
        allowed[self._budget.end[self._forced]] = True
        return mx.where(mx.array(allowed), logits, -mx.inf)

    def mark(self) -> tuple[str, tuple[int, ...], int, int, bool]:
        return self._state, tuple(self._recent), self._spent, self._forced, self._started

    def rewind(self, mark: tuple[str, tuple[int, ...], int, int, bool], kept: list[int]) -> None:
        """Back to ``mark``, then see the tokens a speculative step kept (the first of
        them as a call would: only once started)."""
        state, recent, self._spent, self._forced, started = mark
        self._state, self._recent, self._started = state, list(recent), True
        for i, token in enumerate(kept):
            if (started or i > 0) and self._state != "after":
                self._see(token)

    def _see(self, token: int) -> None:
        b = self._budget
        keep = max(len(b.start), len(b.end))
        self._recent = [*self._recent, token][-keep:]
        if self._state == "before":
            if _ends_with(self._recent, b.start):
                self._state, self._spent = "thinking", 0
        elif self._state == "thinking":
            self._spent += 1
            if _ends_with(self._recent, b.end):
                self._state = "after"
            elif self._spent >= b.tokens:
                self._state, self._forced = "forcing", 0
        elif self._state == "forcing":
            self._forced += 1
            if self._forced == len(b.end):
                self._state = "after"


def _ends_with(seq: list[int], tail: tuple[int, ...]) -> bool:
    return bool(tail) and tuple(seq[-len(tail) :]) == tail


def grammar_finish_reason(request: GenerationRequest, reason: str) -> str:
    """``length`` for a row whose grammar failed: its output is incomplete, never a finished
    answer that does not parse; the reason is logged once."""
    failure = request.constraint.failure() if request.constraint is not None else None
    if failure is None:
        return reason
    log.warning("the output grammar failed mid-answer (%s); finish_reason is length", failure)
    return "length"


def request_processors(
    request: GenerationRequest, eos_token_ids: Sequence[int]
) -> list[LogitsProcessor]:
    """The processors a request needs, in order: penalties, then the grammar mask."""
    out: list[LogitsProcessor] = []
    penalties = request.sampling.penalties
    if penalties.active:
        made = make_logits_processors(
            logit_bias=dict(penalties.logit_bias) or None,
            repetition_penalty=penalties.repetition if penalties.repetition != 1.0 else None,
            repetition_context_size=penalties.context,
            presence_penalty=penalties.presence or None,
            presence_context_size=penalties.context,
            frequency_penalty=penalties.frequency or None,
            frequency_context_size=penalties.context,
        )
        out += [_text_history(p) for p in made] if request.images else made
    if request.reasoning_budget is not None and request.reasoning_budget.end:
        out.append(BudgetEnforcer(request.reasoning_budget))
    if request.constraint is not None:
        out.append(GrammarMask(request.constraint, eos_token_ids))
    return out


def _text_history(processor: LogitsProcessor) -> LogitsProcessor:
    """``processor`` shown only the text of the history: an image's key ids
    (``domain/cache/image_keys``) are no vocabulary entries a penalty could index."""

    def text_only(tokens: mx.array, logits: mx.array) -> mx.array:
        history = np.asarray(tokens)
        return processor(mx.array(history[history < IMAGE_ID_BASE]), logits)

    return text_only


def token_logprob(token: int, row: mx.array, top: int) -> TokenLogprob:
    """The chosen token's log-probability in ``row`` (a log-softmax) and the ``top`` best.

    Tokens a grammar masked out (-inf) are never listed among the best.
    """
    chosen = float(row[token].item())
    if top <= 0:
        return TokenLogprob(token, chosen)
    k = min(top, row.shape[-1])
    ids = mx.argpartition(-row, k - 1)[:k]
    values = row[ids]
    order = mx.argsort(-values)
    best = [
        (int(i), float(v))
        for i, v in zip(ids[order].tolist(), values[order].tolist(), strict=True)
        if v != float("-inf")
    ]
    return TokenLogprob(token, chosen, tuple(best))
