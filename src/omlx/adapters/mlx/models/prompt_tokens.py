"""Tokenizing a conversation that grows: reuse the tokens of the prompt it extends.

An agent resends its whole conversation every turn, and tokenizing 17k tokens of it
costs a few hundred milliseconds of the turn's time to first token here. A Hugging Face
tokenizer cuts its input at added (special) tokens before normalizing, pre-tokenizing
and merging, and encodes the pieces between them independently. So where a new prompt
repeats a recent one up to and including one of its special tokens (every chat turn
opens with one, ``<|im_start|>`` and the like), the tokens before that special token
are the recent prompt's, and only the text from it on needs encoding.

That holds only for special tokens matched verbatim: not stripping the whitespace
around them (``lstrip``/``rstrip``), not ``single_word``, not normalized, and not the
part of a longer added token (which a different continuation could match instead).
Tokens without those properties are never used as cut points; tokenizers without a
fast backend are encoded whole. ``tests/integration/test_prompt_tokens.py`` checks the
result against whole encoding on random conversations.

Encoding goes through ``encode_batch``, which releases the GIL while Rust works
(``encode`` holds it: a long prompt would stall the event loop and every other
request). A prompt at or past ``max_tokens`` (the context: it is refused) is not
remembered, so refused prompts cost no memory once answered.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

# Shorter prompts are encoded whole: nothing worth saving, one code path for them.
MIN_REUSE_CHARS = 2048


@dataclass(slots=True)
class _Encoded:
    text: str
    ids: list[int]
    cuts: list[tuple[int, int, int]]  # (token index, start, end char) of each cut-point token


def fast_backend(tokenizer: Any) -> Any | None:
    """The ``tokenizers.Tokenizer`` behind an mlx-lm or Hugging Face tokenizer, if any."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(inner, "backend_tokenizer", inner)
    has_api = hasattr(backend, "get_added_tokens_decoder") and hasattr(backend, "encode")
    return backend if has_api else None


class PrefixReusingEncoder:
    """``encode(text)`` equal to the backend's whole encoding, reusing a recent prompt's tokens."""

    def __init__(self, backend: Any, recent: int = 8, max_tokens: int | None = None) -> None:
        self.backend = backend
        self.recent = recent
        self.max_tokens = max_tokens  # prompts this long are refused: not worth remembering
        self._recent: list[_Encoded] = []  # most recent last
        self._lock = threading.Lock()  # prompts are rendered on worker threads
        added = {i: t for i, t in backend.get_added_tokens_decoder().items()}
        contents = [t.content for t in added.values()]
        self.cut_ids = frozenset(
            i
            for i, t in added.items()
            if t.special
            and not (t.lstrip or t.rstrip or t.single_word or t.normalized)
            and not any(o != t.content and t.content in o for o in contents)
        )
        self.reused_tokens = 0  # for tests and curiosity

    def encode(self, text: str) -> list[int]:
        base = self._base_for(text) if len(text) >= MIN_REUSE_CHARS and self.cut_ids else None
        if base is None:
            return self._remember(text, self._encode(text), 0, [])
        index, offset, _ = base[1]
        tail = self._encode(text[offset:])
        head_ids = base[0].ids[:index]
        head_cuts = [c for c in base[0].cuts if c[0] < index]
        self.reused_tokens += index
        return self._remember(text, tail, offset, head_cuts, head_ids)

    def _encode(self, text: str) -> Any:
        return self.backend.encode_batch([text], add_special_tokens=False)[0]

    def _base_for(self, text: str) -> tuple[_Encoded, tuple[int, int, int]] | None:
        """The recent prompt sharing the longest prefix with ``text``, and its last cut in it."""
        best: tuple[_Encoded, tuple[int, int, int]] | None = None
        with self._lock:
            recent = list(self._recent)
        for entry in recent:
            shared = _common_prefix_length(entry.text, text)
            cut = _last_cut_within(entry, shared)
            if cut is not None and (best is None or cut[0] > best[1][0]):
                best = (entry, cut)
        return best

    def _remember(
        self,
        text: str,
        encoding: Any,
        offset: int,
        head_cuts: list[tuple[int, int, int]],
        head_ids: list[int] | None = None,
    ) -> list[int]:
        head_ids = head_ids or []
        ids = head_ids + list(encoding.ids)
        base = len(head_ids)
        cuts = head_cuts + [
            (base + k, offset + start, offset + end)
            for k, (token, (start, end)) in enumerate(
                zip(encoding.ids, encoding.offsets, strict=True)
            )
            if token in self.cut_ids
        ]
        if self.max_tokens is not None and len(ids) >= self.max_tokens:
            return ids
        with self._lock:
            kept = (
                [e for e in self._recent if e.text != text][-(self.recent - 1) :]
                if self.recent > 1
                else []
            )
            self._recent = [*kept, _Encoded(text, ids, cuts)]
        return ids


def _last_cut_within(entry: _Encoded, shared: int) -> tuple[int, int, int] | None:
    """The last cut-point token lying wholly inside the first ``shared`` characters."""
    for index, start, end in reversed(entry.cuts):
        if index == 0:
            return None  # nothing before it to reuse
        if end <= shared:
            return index, start, end
    return None


def _common_prefix_length(a: str, b: str) -> int:
    """Length of the longest common prefix, by bisection on slice equality (C-speed compares)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo], a[:hi+1] != b[:hi+1] once hi shrinks
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
