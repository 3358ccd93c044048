"""What a constrained request's output must be, in terms any grammar engine can compile.

The app builds an ``OutputGrammar`` from a request (a JSON schema to answer with, or tools
that must be called) and the model's own tool-call syntax (``CallShape``: the literal text
around each call's arguments, and around the calls); a ``GrammarCompiler`` adapter turns it
into a per-request ``TokenConstraint``. Values are frozen and hashable: compiled grammars
are cached by them.
"""

from __future__ import annotations

from dataclasses import dataclass


class GrammarError(ValueError):
    """The grammar cannot be built: a schema omlx cannot enforce, or an invalid one."""


@dataclass(frozen=True, slots=True)
class PairStyle:
    """Arguments written key by key instead of as one JSON object (GLM, Gemma).

    Each argument is ``key_open KEY key_close VALUE value_close``; arguments are joined by
    ``separator``. A string value is written raw (``quote`` None) or between ``quote``'s
    two delimiters; other values as JSON.
    """

    key_open: str
    key_close: str
    value_close: str
    separator: str = ""
    quote: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class CallShape:
    """One tool's call as the model writes it: ``before``, the arguments, ``after``.

    ``before`` and ``after`` are literal pieces, each of which may be one special token
    (``<|python_tag|>``); a piece of whitespace only stands for a little optional
    whitespace. ``parameters`` is the arguments' JSON schema as canonical JSON.
    """

    name: str
    before: tuple[str, ...]
    parameters: str
    after: tuple[str, ...] = ()
    pairs: PairStyle | None = None


@dataclass(frozen=True, slots=True)
class OutputGrammar:
    """Either an answer in JSON (``json_schema``) or calls to one of ``calls``, never both.

    ``opening`` and ``closing`` frame the calls (a tool-call section), ``between`` separates
    two calls when ``several_calls`` allows more than one. ``think`` lets a reasoning
    section come first (the model's markers); ``in_reasoning`` says the prompt already
    opened it. ``strict`` False ignores schema keywords that cannot be enforced instead of
    refusing the schema.
    """

    json_schema: str | None = None
    calls: tuple[CallShape, ...] = ()
    opening: tuple[str, ...] = ()
    between: tuple[str, ...] = ()
    closing: tuple[str, ...] = ()
    several_calls: bool = False
    think: tuple[str, str] | None = None
    in_reasoning: bool = False
    strict: bool = True

    def __post_init__(self) -> None:
        if (self.json_schema is None) == (not self.calls):
            raise GrammarError("an output grammar is a JSON schema or a set of tool calls")
