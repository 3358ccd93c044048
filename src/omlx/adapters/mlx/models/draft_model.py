"""Draft-model drafting: a small model with the served model's tokenizer guesses the next
tokens greedily, one cheap forward pass each; the served model verifies them in one.

The draft model keeps its own KV cache per row, kept in step with the row's tokens: each
call feeds it only what it has not seen (the tokens the served model kept since the last
call, and the pending one), after trimming what it drafted and the served model refused.
A row's first call prefills the draft model on at most ``window`` of its last tokens, not
on the whole (maybe 100k-token) prompt: positions are relative under RoPE, and a draft
model needs the recent text to guess well, not all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from omlx.domain.speculation import DRAFT_MODEL

DRAFT_WINDOW = 4096
_PREFILL_STEP = 512


class TokenizerMismatch(ValueError):
    """The draft model would propose ids that mean other text to the served model."""


def check_same_tokenizer(draft: Any, served: Any, draft_name: str, served_name: str) -> None:
    """Raise ``TokenizerMismatch`` naming both models unless their vocabularies are equal."""
    ours, theirs = served.get_vocab(), draft.get_vocab()
    if ours == theirs:
        return
    differing = sum(1 for piece, i in ours.items() if theirs.get(piece) != i) + len(
        theirs.keys() - ours.keys()
    )
    raise TokenizerMismatch(
        f"draft model {draft_name} does not share the tokenizer of {served_name} "
        f"({len(theirs)} vs {len(ours)} tokens, {differing} differ): speculative decoding needs "
        "a draft model of the same family and tokenizer"
    )


@dataclass(slots=True)
class _DraftRow:
    cache: list[Any]
    origin: int  # position in the row's tokens where the draft cache starts
    seen: list[int] = field(default_factory=list)  # the tokens the draft cache holds


class DraftModel:
    """Drafts from a small model (``batch.speculation.Proposer``)."""

    method = DRAFT_MODEL
    free = False  # each draft is a forward pass of the draft model: asked only when used

    def __init__(self, model: Any, name: str, window: int = DRAFT_WINDOW) -> None:
        if not all(type(c) is KVCache for c in make_prompt_cache(model)):
            raise ValueError(
                f"draft model {name}: only plain attention models can draft (its cache has "
                "recurrent or sliding-window layers, which cannot take back a refused draft)"
            )
        self.model = model
        self.window = window
        self._rows: dict[int, _DraftRow] = {}

    def propose(
        self,
        uid: int,
        tokens: Sequence[int],
        pending: int,
        limit: int,
        choose: Callable[[int], int],
    ) -> list[int]:
        count = choose(limit)
        if count < 1:
            return []
        context = [*tokens, pending]
        row = self._rows.get(uid)
        if row is None or len(context) < row.origin:
            origin = max(0, len(context) - self.window)
            row = self._rows[uid] = _DraftRow(make_prompt_cache(self.model), origin)
        logits = self._catch_up(row, context[row.origin :])
        drafts: list[int] = []
        for _ in range(count):
            token = int(mx.argmax(logits[0, -1]).item())
            drafts.append(token)
            if len(drafts) == count:
                break
            logits = self.model(mx.array([[token]]), cache=row.cache)
            row.seen.append(token)
        return drafts

    def _catch_up(self, row: _DraftRow, context: list[int]) -> mx.array:
        """Feed the draft model what it has not seen of ``context``; its last logits."""
        common = 0
        limit = min(len(row.seen), len(context) - 1)  # the last token is always fed anew
        while common < limit and row.seen[common] == context[common]:
            common += 1
        extra = len(row.seen) - common
        if extra:
            for layer in row.cache:
                layer.trim(extra)
            del row.seen[common:]
        fresh = context[common:]
        logits = None
        for start in range(0, len(fresh), _PREFILL_STEP):
            chunk = fresh[start : start + _PREFILL_STEP]
            logits = self.model(mx.array([chunk]), cache=row.cache)
            if start + _PREFILL_STEP < len(fresh):
                mx.eval([c.state for c in row.cache])
        row.seen.extend(fresh)
        assert logits is not None
        return logits

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)
