"""Constrained decoding: output grammars compiled for a model's tokenizer (llguidance)."""

from __future__ import annotations

from omlx.adapters.grammar.llguidance import Constraint, LLGuidanceCompiler

__all__ = ["Constraint", "LLGuidanceCompiler"]
