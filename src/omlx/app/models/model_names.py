"""Which served model a request's ``model`` names: served ids, aliases and globs.

Agents ask for their own model names (Claude Code: ``claude-opus-…``, ``claude-haiku-…``).
An alias ``NAME=ID`` answers ``NAME`` with the served model ``ID``; ``NAME`` may be a glob
(``claude-*``), and a bare ``NAME`` means the default model: the one served model, or with
several the first chat model named (``--model``) or found (``--model-dir``, in name order). ``answer_any_model`` (one
served model only) answers every name with it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from omlx.app.errors import NotFound


@dataclass(frozen=True, slots=True)
class Alias:
    name: str  # exact name or glob
    target: str

    @property
    def is_glob(self) -> bool:
        return any(ch in self.name for ch in "*?[")

    def matches(self, requested: str) -> bool:
        return fnmatch.fnmatchcase(requested, self.name) if self.is_glob else requested == self.name


def parse_aliases(
    specs: Sequence[str], served: Sequence[str], default: str | None = None
) -> tuple[Alias, ...]:
    """``NAME=ID`` or ``NAME`` (the default model); ValueError naming the bad spec."""
    aliases = []
    for spec in specs:
        name, eq, target = (part.strip() for part in spec.partition("="))
        if not name:
            raise ValueError(f"model alias {spec!r}: give NAME=MODEL_ID")
        if not eq:
            if len(served) == 1:
                default = served[0]
            if default is None:
                raise ValueError(
                    f"model alias {spec!r} names no model, and this server serves several: "
                    f"write {name}=MODEL_ID"
                )
            target = default
        if target not in served:
            raise ValueError(
                f"model alias {spec!r} points at {target!r}, which is not served "
                f"(served: {', '.join(served)})"
            )
        aliases.append(Alias(name, target))
    return tuple(aliases)


class ModelNames:
    def __init__(
        self,
        served: Sequence[str],
        aliases: Sequence[str] = (),
        answer_any_model: bool = False,
        default: str | None = None,
    ) -> None:
        self.served = tuple(served)
        self.aliases = parse_aliases(aliases, self.served, default)
        if answer_any_model and len(self.served) != 1:
            raise ValueError("answer_any_model needs exactly one served model")
        self.answer_any_model = answer_any_model

    def resolve(self, requested: str) -> str:
        """The served model id for ``requested``; NotFound (404) otherwise."""
        if requested in self.served:
            return requested
        for alias in self.aliases:
            if alias.matches(requested):
                return alias.target
        if self.answer_any_model:
            return self.served[0]
        names = [*self.served, *(a.name for a in self.aliases)]
        raise NotFound(
            f"the model {requested!r} does not exist; this server serves {', '.join(names)}",
            param="model",
            code="model_not_found",
        )

    def aliases_of(self, model_id: str) -> list[str]:
        return [a.name for a in self.aliases if a.target == model_id]
