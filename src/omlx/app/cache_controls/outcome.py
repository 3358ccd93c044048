"""Why a prompt's cached prefix ends where it does: the ``outcome`` of a cache report.

The prefix cache says how far it holds a prompt and what it holds past that point; the
app knows the conversation around it (whether the prompt is a conversation's first turn,
how much its previous turn's prompt shares, the template's fixed preamble). Together they
tell a turn that merely goes on past everything computed (``extended``: an ordinary
follow-up) from one whose earlier tokens changed (``changed``) or whose blocks were
kept and then evicted (``evicted``); a conversation's first turn (``new_conversation``)
and a prefix another request is computing right now (``in_flight``) are not misses. Only
``evicted`` and ``changed`` say the cache lost work it had.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from omlx.domain.cache.probe import CachedPrefix

HIT = "hit"  # everything but the last token restored
EXTENDED = "extended"  # the prompt goes on past everything stored there: new tokens
CHANGED = "changed"  # a stored block holds other tokens there: the prompt changed
EVICTED = "evicted"  # the cache held more of this prompt once, and holds it no longer
NEW_CONVERSATION = "new_conversation"  # a first turn: shares only what other conversations do
IN_FLIGHT = "in_flight"  # another running request was computing the rest of the prefix
RESTORE_POINT = "restore_point"  # the KV held it all; a hybrid restores from an earlier point
PENDING = "pending"  # the response started before the prompt was looked up (queued)
OUTCOMES = (HIT, EXTENDED, CHANGED, EVICTED, NEW_CONVERSATION, IN_FLIGHT, RESTORE_POINT)
MISSES = frozenset({CHANGED, EVICTED})  # the cache lost work it had

# How much a request restored, against its template's fixed preamble.
RESTORED_NONE, RESTORED_PREAMBLE, RESTORED_PAST_PREAMBLE = "none", "preamble", "past_preamble"

# Roles that only a conversation's later turns carry: an earlier answer, a tool's result.
_LATER_ROLES = frozenset({"assistant", "tool", "function"})


@dataclass(frozen=True, slots=True)
class PromptHistory:
    """What the app knows of a prompt beyond the cache.

    ``first_turn``: its messages hold no earlier answer (a conversation's first request).
    ``previous_shared``: tokens the prompt shares with its conversation's previous prompt
    (0: none known). ``preamble``: its leading tokens that are the chat template's fixed
    preamble, which every conversation's rendering starts with.
    """

    first_turn: bool = False
    previous_shared: int = 0
    preamble: int = 0


def first_turn(roles: Iterable[str]) -> bool:
    """Whether messages with these roles start a conversation: no answer or tool result yet."""
    return not any(role in _LATER_ROLES for role in roles)


def outcome_of(found: CachedPrefix, history: PromptHistory) -> str:
    """Why ``found`` (what a request restored, or a probe found) ends where it does.

    In order: a full hit; a prefix in flight (another request was computing it); a KV match
    to the end that a hybrid restores from an earlier restore point; tokens the cache held
    once (the conversation's previous prompt had them, or the next block was kept and is
    gone); a conversation's first turn; other tokens stored there (the prompt changed); else
    the prompt goes on past everything stored (new tokens).
    """
    if found.full_hit:
        return HIT
    if found.in_flight:
        return IN_FLIGHT
    at = found.diverged_at
    if found.prompt_tokens and at >= found.prompt_tokens - 1:
        return RESTORE_POINT
    if found.evicted or history.previous_shared > at:
        return EVICTED
    if history.first_turn:
        return NEW_CONVERSATION
    if found.stored_next:
        return CHANGED
    return EXTENDED


def restored_share(cached: int, preamble: int) -> str:
    """``none``, ``preamble`` (no more than the template's fixed preamble: every request of
    the model restores that much) or ``past_preamble`` (a hit worth the name)."""
    if not cached:
        return RESTORED_NONE
    return RESTORED_PAST_PREAMBLE if cached > preamble else RESTORED_PREAMBLE
