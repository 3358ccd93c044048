"""Refusing a prompt too long for the context before tokenizing it.

Tokenizing 10 MB of text takes tens of seconds; counting its characters takes
microseconds. No token of a vocabulary spans more characters than its longest entry
(byte-level entries spell one byte per character, at least as many as the text's
characters), so a text longer than ``context × longest entry`` characters cannot fit in
``context`` tokens, whatever it says. (Tokenizers that drop characters outright, such
as WordPiece's whitespace, are the exception: such a text is refused although its
tokens might fit; a real prompt is never that long.)
"""

from __future__ import annotations

from typing import Any

from omlx.app.errors import InvalidRequest


def longest_token_chars(tokenizer: Any) -> int | None:
    """The characters of the vocabulary's longest entry, or None where there is no vocabulary."""
    inner = getattr(tokenizer, "_tokenizer", None)
    for owner in (tokenizer, inner, getattr(inner, "backend_tokenizer", None)):
        get_vocab = getattr(owner, "get_vocab", None)
        if callable(get_vocab):
            vocab = get_vocab()
            if vocab:
                return max(len(entry) for entry in vocab)
    return None


class PromptLimit:
    """The longest text a model's context can hold, by the character bound above."""

    def __init__(self, context_tokens: int, per_token: int | None) -> None:
        self.context_tokens = context_tokens
        self.per_token = per_token
        self.max_chars = context_tokens * per_token if per_token else None

    @classmethod
    def of(cls, tokenizer: Any, context_tokens: int) -> PromptLimit:
        return cls(context_tokens, longest_token_chars(tokenizer))

    def check(self, text: str, param: str, what: str = "the prompt") -> None:
        """A 400 ``context_length_exceeded`` when ``text`` cannot fit, before it is tokenized."""
        if self.max_chars is not None and len(text) > self.max_chars:
            raise InvalidRequest(
                f"{what} has {len(text)} characters: more than this model's context of "
                f"{self.context_tokens} tokens can hold (at most {self.max_chars} characters)",
                param=param,
                code="context_length_exceeded",
            )
