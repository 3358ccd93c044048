"""Errors the MLX adapter raises for models it cannot serve correctly."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """A model file uses an architecture, tensor type or tokenizer we do not support.

    Raised instead of loading something that would run or tokenize wrongly.
    """


class ModelNotInstalledError(FileNotFoundError):
    """The default model's package is not installed."""
