"""Prompt normalizations: volatile text that real clients put in a prompt's prefix, removed
before rendering so the prefix cache can match it across sessions (DESIGN §6).

Each rule is named, says which client it serves and why, and rewrites one system text
block (a block, or a system message's text) to what the model should see: the block
without its volatile part, or nothing. The list is closed and documented
(``docs/api.md``, "Prompt normalizations"); ``prompt_normalizations`` in the settings picks which run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Normalization:
    name: str
    client: str
    why: str
    rewrite: Callable[[str], str | None]  # a system text block -> new text, None to drop it


_BILLING_HEADER = "x-anthropic-billing-header:"


def _strip_billing_header(text: str) -> str | None:
    """Remove the header line from a block that starts with it; the block goes if nothing is left."""
    if not text.startswith(_BILLING_HEADER):
        return text
    _, newline, rest = text.partition("\n")
    rest = rest if newline else ""
    return rest if rest.strip() else None


RULES: tuple[Normalization, ...] = (
    Normalization(
        name="claude_code_billing_header",
        client="Claude Code",
        why=(
            "Claude Code puts an 'x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; "
            "cch=...;' block first in its system prompt, with a value that changes per session "
            "(and per request in interactive use); before the system prompt and the tools, it "
            "would make every session's prefix new. It is billing metadata for Anthropic's API, "
            "not an instruction to the model."
        ),
        rewrite=_strip_billing_header,
    ),
)
RULE_NAMES = tuple(rule.name for rule in RULES)


class PromptNormalizer:
    """Applies the enabled rules to system text blocks and counts what each rule changed."""

    def __init__(self, enabled: Iterable[str] = RULE_NAMES) -> None:
        names = list(enabled)
        unknown = sorted(set(names) - set(RULE_NAMES))
        if unknown:
            raise ValueError(
                f"unknown prompt normalization {', '.join(unknown)}; known: {', '.join(RULE_NAMES)}"
            )
        self.rules = tuple(rule for rule in RULES if rule.name in names)
        self._applied = dict.fromkeys(RULE_NAMES, 0)
        self._lock = threading.Lock()

    def system_blocks(self, blocks: Iterable[str]) -> list[str]:
        """The blocks as the model should see them (rewritten, or dropped)."""
        out: list[str] = []
        for text in blocks:
            kept: str | None = text
            for rule in self.rules:
                changed = rule.rewrite(kept)
                if changed != kept:
                    with self._lock:
                        self._applied[rule.name] += 1
                kept = changed
                if kept is None:
                    break
            if kept is not None:
                out.append(kept)
        return out

    def applied(self) -> dict[str, int]:
        """Times each rule changed a block since start (for /metrics)."""
        with self._lock:
            return dict(self._applied)
