"""Log-probabilities in OpenAI's shapes: chat ``logprobs.content`` and completions ``logprobs``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from omlx.app.api.openai.schemas import (
    ChoiceLogprobs,
    CompletionLogprobs,
    TokenLogprobBody,
    TopLogprob,
)
from omlx.domain.generation import TokenLogprob

TokenText = Callable[[int], tuple[str, bytes]]
# OpenAI's stand-in for a token too unlikely to rank (JSON has no -Infinity).
UNLIKELY = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else UNLIKELY


def chat_logprobs(entries: Sequence[TokenLogprob], token_text: TokenText) -> ChoiceLogprobs:
    content = []
    for entry in entries:
        text, raw = token_text(entry.token)
        top = []
        for token, value in entry.top:
            t_text, t_raw = token_text(token)
            top.append(TopLogprob(t_text, _finite(value), list(t_raw)))
        content.append(TokenLogprobBody(text, _finite(entry.logprob), list(raw), top))
    return ChoiceLogprobs(content)


def completion_logprobs(
    entries: Sequence[TokenLogprob], token_text: TokenText, offset: int = 0
) -> CompletionLogprobs:
    """``offset``: where the first token's text starts in the choice's whole text."""
    tokens, values, tops, offsets = [], [], [], []
    for entry in entries:
        text, _ = token_text(entry.token)
        tokens.append(text)
        values.append(_finite(entry.logprob))
        tops.append({token_text(t)[0]: _finite(v) for t, v in entry.top})
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs(tokens, values, tops, offsets)
