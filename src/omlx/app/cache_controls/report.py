"""What the cache held of a request's prompt, and where the prompt left it (``x-omlx-cache``).

A request's report is made from what its restore used (``CacheSession.restored``, carried
by the engine's ``PrefillStarted``), so its ``cached`` is its usage's; ``explain`` makes
one from the prefix cache's read-only probe. This module turns the token where the prompt
leaves the cache into the message it falls in (index and role, from the rendered
template's message boundaries; on an ordinary follow-up, the new message rather than the
end-of-turn markup of the answer before it), says why it ends there (``outcome``), and
adds a short excerpt of the prompt and of what the cache holds there. It names the server
that computed the deepest block restored (servers sharing a cold tier: whose work this
was) and, in the JSON, the session the request named (``session_key``). Every chat
response carries it as a header, ``POST /v1/cache/explain`` returns it whole, and the
debug line logs it, so a user can see why a turn was slow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omlx.app.cache_controls.outcome import (
    HIT,
    IN_FLIGHT,
    PromptHistory,
    outcome_of,
    restored_share,
)
from omlx.domain.cache.image_keys import is_image_id
from omlx.domain.cache.partial_match import common_prefix
from omlx.domain.cache.probe import CachedPrefix
from omlx.domain.json_values import JsonObject

log = logging.getLogger(__name__)

HEADER = "x-omlx-cache"
ImageDigest = Callable[[int], str | None]
# Whether tokens are only a template's markup (special tokens, whitespace): no one's words.
Markup = Callable[[Sequence[int]], bool]
EXCERPT_TOKENS = 24
MARKUP_TOKENS = 16  # the most end-of-turn markup between a message's words and the next one
DIGEST_CHARS = 12  # of an image's SHA-256 in the header (the JSON report has all 64)
UNKNOWN_SERVER = "unknown"  # restored blocks whose rows predate the record, or imported


@dataclass(frozen=True, slots=True)
class CacheReport:
    """One prompt against the cache: what a request restored of it (``explain``: what the
    cache holds of it now), where the prompt leaves the cache and why."""

    prompt_tokens: int
    cached: int
    tier: str  # hot | ssd | none
    full_hit: bool
    message: int | None = None  # the rendered conversation's message the prompt leaves it in
    role: str | None = None
    part: str | None = None  # the request's part: "system", "tools", "messages[k]"
    before: str = ""  # the prompt just before the divergence
    prompt_next: str = ""  # the prompt from the divergence on
    cached_next: str = ""  # what a stored block holds there instead ("" : the cache ends)
    no_store: bool = False
    # Where the prompt and the cache part at an image (a VLM's key ids): the SHA-256 of the
    # prompt's image there, and of the one the cache holds instead ("" : one this server has
    # not been sent since it started; None: text there).
    image: str | None = None
    cached_image: str | None = None
    # The server that computed the deepest block restored (``UNKNOWN_SERVER``: not recorded);
    # None when nothing is.
    computed_by: str | None = None
    session: str | None = None  # the session the request named (``session_key``)
    session_source: str | None = None  # the header or field that named it
    outcome: str = HIT  # why the cached prefix ends where it does (``outcome``)
    # Where the prompt leaves what the cache holds: ``cached`` but for a hybrid model,
    # which restores from the deepest restore point before it.
    matched: int | None = None
    preamble: int = 0  # its leading tokens that are the template's fixed preamble
    in_flight: int = 0  # positions past ``cached`` another running request was computing
    waited: bool = False  # it waited for another request's prefill of its prefix

    @property
    def diverged_at(self) -> int | None:
        if self.full_hit:
            return None
        return self.cached if self.matched is None else max(self.matched, self.cached)

    @property
    def restored(self) -> str:
        """``none``, ``preamble`` or ``past_preamble`` (``outcome.restored_share``)."""
        return restored_share(self.cached, self.preamble)

    def header(self) -> str:
        """``cached=N; tier=T; computed_by=S; outcome=O; diverged_at=D; message=K; role=R``
        (``computed_by`` absent when nothing is restored, the last three on a full hit)."""
        fields = [f"cached={self.cached}", f"tier={self.tier}"]
        if self.computed_by is not None:
            fields.append(f"computed_by={self.computed_by}")
        fields.append(f"outcome={self.outcome}")
        if self.outcome == IN_FLIGHT:
            fields.append(f"in_flight={self.in_flight}")
        if not self.full_hit:
            fields.append(f"diverged_at={self.diverged_at}")
            if self.message is not None:
                fields += [f"message={self.message}", f"role={self.role}"]
            if self.image is not None:
                fields.append(f"image={self.image[:DIGEST_CHARS] or 'unknown'}")
            if self.cached_image is not None:
                fields.append(f"cached_image={self.cached_image[:DIGEST_CHARS] or 'unknown'}")
        return "; ".join(fields)

    def as_json(self) -> JsonObject:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached,
            "tier": self.tier,
            "computed_by": self.computed_by,
            "full_hit": self.full_hit,
            "outcome": self.outcome,
            "restored": self.restored,
            "preamble_tokens": self.preamble,
            "in_flight_tokens": self.in_flight,
            "waited_for_prefill": self.waited,
            "diverged_at": self.diverged_at,
            "message": self.message,
            "role": self.role,
            "part": self.part,
            "image": self.image,
            "cached_image": self.cached_image,
            "session": self.session,
            "session_source": self.session_source,
            "excerpt": {
                "before": self.before,
                "prompt": self.prompt_next,
                "cached": self.cached_next,
            },
            "header": self.header(),
        }


def message_at(
    offset: int,
    n_messages: int,
    prompt: Sequence[int],
    prefix_tokens: Callable[[int], Sequence[int]],
) -> int:
    """The index of the message the prompt's token ``offset`` falls in.

    ``prefix_tokens(k)`` is the rendered prompt of the first ``k`` messages: where it stops
    agreeing with ``prompt`` is where message ``k`` starts. Halving over ``k`` renders
    about log2(messages) prefixes, not one per message.
    """
    lo, hi = 0, n_messages - 1  # the answer: the last k whose start is <= offset
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if common_prefix(prefix_tokens(mid), prompt) <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo


def tools_span_of(with_tools: Sequence[int], without: Sequence[int]) -> tuple[int, int]:
    """The tokens a tool list adds to a rendering: where the two part and where they meet again."""
    start = common_prefix(with_tools, without)
    tail = common_prefix(with_tools[::-1], without[::-1])
    return start, max(len(with_tools) - tail, start)


def _within(at: int, span: Callable[[], tuple[int, int]] | None) -> bool:
    if span is None:
        return False
    try:
        start, end = span()
    except Exception:  # a template that rejects the probe rendering: say less, never fail
        return False
    return start <= at < end


@dataclass(frozen=True, slots=True)
class PromptParts:
    """What names a prompt's parts in a report: its template messages and their labels.

    ``prefix_tokens(k)``: the rendered prompt of the first ``k`` messages. ``changed_part``:
    the request part the conversation's previous turn says changed
    (``diagnostics.compare``); ``tools_span``: the prompt tokens the tool list renders as.
    Either names a tool-list change, which falls inside a message's rendering. Empty for a
    raw prompt.
    """

    messages: Sequence[JsonObject] = ()
    labels: Sequence[str] = ()
    prefix_tokens: Callable[[int], Sequence[int]] | None = None
    changed_part: str | None = None
    tools_span: Callable[[], tuple[int, int]] | None = None


def _image_named(token: int | None, image_digest: ImageDigest | None) -> str | None:
    """The digest of the image ``token`` is a key id of ("" : unknown), None for text."""
    if token is None or not is_image_id(token):
        return None
    return (image_digest(token) if image_digest is not None else None) or ""


def report(
    found: CachedPrefix,
    prompt: Sequence[int],
    decode: Callable[[Sequence[int]], str],
    parts: PromptParts,
    image_digest: ImageDigest | None = None,
    history: PromptHistory | None = None,
    markup: Markup | None = None,
) -> CacheReport:
    """``found`` (what a request restored of ``prompt``, or a probe found) as a report naming
    where it ends and why (``history``: what the app knows of the conversation).

    ``image_digest(key_id)``: the image a VLM prompt's key id belongs to, when known.
    ``markup``: tells a template's end-of-turn tokens from words (the new-message rule)."""
    history = history or PromptHistory()
    computed_by = (found.computed_by or UNKNOWN_SERVER) if found.tokens else None
    preamble = min(history.preamble, len(prompt))
    outcome = outcome_of(found, history)
    if found.full_hit:
        return CacheReport(
            len(prompt),
            found.tokens,
            found.tier,
            True,
            computed_by=computed_by,
            outcome=outcome,
            preamble=preamble,
            waited=found.waited,
        )
    at = found.diverged_at
    message = role = part = None
    messages, labels = parts.messages, parts.labels
    if messages:
        index = _message_of(at, prompt, parts, markup if not found.stored_next else None)
        if index is not None:
            message, role = index, str(messages[index].get("role", ""))
            part = labels[index] if index < len(labels) else None
            if index == 0 and (parts.changed_part == "tools" or _within(at, parts.tools_span)):
                part = "tools"  # the tools render with the first message
    result = CacheReport(
        len(prompt),
        found.tokens,
        found.tier,
        False,
        message,
        role,
        part,
        before=decode(prompt[max(at - EXCERPT_TOKENS, 0) : at]),
        prompt_next=decode(prompt[at : at + EXCERPT_TOKENS]),
        cached_next=decode(found.stored_next[:EXCERPT_TOKENS]),
        image=_image_named(prompt[at] if at < len(prompt) else None, image_digest),
        cached_image=_image_named(
            found.stored_next[0] if found.stored_next else None, image_digest
        ),
        computed_by=computed_by,
        outcome=outcome,
        matched=at,
        preamble=preamble,
        in_flight=found.in_flight,
        waited=found.waited,
    )
    log.debug(
        "cache: %s (part %s); the prompt goes on %r where the cache holds %r",
        result.header(),
        part or "-",
        result.prompt_next,
        result.cached_next,
    )
    return result


def _message_of(
    at: int, prompt: Sequence[int], parts: PromptParts, markup: Markup | None
) -> int | None:
    """The message the prompt's token ``at`` falls in (None: the template would not say).

    With ``markup`` (the cache simply ends at ``at``), a token among the end-of-turn
    markup closing a message names the next message instead: an ordinary follow-up's
    cache holds the previous prompt and answer but not the end-of-turn token the answer
    ended with (it was sampled, never fed back), so the prompt goes past what any turn had
    at the new message, not in the answer.
    """
    n = len(parts.messages)
    if at <= 0 or parts.prefix_tokens is None or n <= 1:
        return 0
    try:
        index = message_at(at, n, prompt, parts.prefix_tokens)
        if markup is not None and index + 1 < n:
            start = common_prefix(parts.prefix_tokens(index + 1), prompt)
            if at < start <= at + MARKUP_TOKENS and markup(prompt[at:start]):
                return index + 1
        return index
    except Exception:  # a template that rejects a prefix: say less, never fail
        log.debug("could not locate token %d among the messages", at, exc_info=True)
        return None
