"""What a constrained request's output must be, in terms any grammar engine can compile.

The app builds an ``OutputGrammar`` from a request (a JSON schema to answer with, or tools
that must be called) and the model's own output syntax (its tool-call and reasoning
markers); a ``GrammarCompiler`` adapter turns it into a per-request ``TokenConstraint``.
Values are frozen and hashable: compiled grammars are cached by them.
"""

from __future__ import annotations

from dataclasses import dataclass


class GrammarError(ValueError):
    """The grammar cannot be built: a schema omlx cannot enforce, or an invalid one."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    parameters: str  # the arguments' JSON schema, as canonical JSON text


@dataclass(frozen=True, slots=True)
class OutputGrammar:
    """Either an answer in JSON (``json_schema``) or calls to ``tools``, never both.

    ``call_markers`` frame each call as the model writes it (``<tool_call>``…``</tool_call>``);
    without them the whole output is one bare JSON call ``{"name": …, "arguments": …}``.
    ``think`` lets a reasoning section come first (the model's markers); ``in_reasoning``
    says the prompt already opened it. ``strict`` False ignores schema keywords that cannot
    be enforced instead of refusing the schema.
    """

    json_schema: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    several_calls: bool = False
    call_markers: tuple[str, str] | None = None
    think: tuple[str, str] | None = None
    in_reasoning: bool = False
    strict: bool = True

    def __post_init__(self) -> None:
        if (self.json_schema is None) == (not self.tools):
            raise GrammarError("an output grammar is a JSON schema or a set of tools")
