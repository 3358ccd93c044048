"""A chat turn's cache report: what the engine restored, in the conversation's words.

The report is made when the engine has restored the turn's prefix (``reporting.reported``
runs ``made``), from the restore itself, the rendered messages (which one the prompt
leaves the cache in), the conversation's previous turn (how much of its prompt this one
shares) and the template's fixed preamble (the tokens every conversation's rendering
starts with, measured once per model and shape by rendering one-message conversations).
``settle`` then counts it and says, in the debug log, why a turn restored less than its
previous prompt shares: evicted blocks, a prompt the template rendered differently, or a
prefix another request was still computing (not a miss).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence

from omlx.app.cache_controls.controls import TurnControls
from omlx.app.cache_controls.outcome import (
    EVICTED,
    IN_FLIGHT,
    PromptHistory,
    first_turn,
)
from omlx.app.cache_controls.report import CacheReport, PromptParts, tools_span_of
from omlx.app.cache_controls.service import CacheControls
from omlx.app.chat.diagnostics import Fingerprint, shared_tokens
from omlx.app.chat.observers import CacheMissObserver
from omlx.app.chat.service import GenerationService
from omlx.app.chat.templates import ChatRenderer
from omlx.app.chat.turn import ChatRequest, ChatTurn
from omlx.app.errors import InvalidRequest
from omlx.domain.cache.partial_match import common_prefix
from omlx.domain.cache.probe import CachedPrefix
from omlx.domain.json_values import JsonObject

log = logging.getLogger("omlx.app.chat.pipeline")  # the pipeline's own lines

OPEN_TURNS_LIMIT = 1024  # turns remembered as not yet done (one refused never closes)
# Two one-message conversations that differ only in their words: where their renderings
# part is where a conversation's own tokens begin.
_PROBE_WORDS = ("Alpha bravo charlie.", "Zulu yankee xray.")


class TurnReports:
    """Makes, counts and logs the cache reports of one model's chat turns."""

    def __init__(
        self,
        service: GenerationService,
        renderer: ChatRenderer,
        controls: CacheControls,
        observer: CacheMissObserver | None = None,
    ) -> None:
        self.service, self.renderer, self.controls = service, renderer, controls
        self.observer = observer
        self._preambles: dict[bool, tuple[int, ...]] = {}  # by "starts with a system message"
        # The fingerprints of turns not yet done, by identity: a previous prompt still being
        # computed (agents start sub-agents together) says nothing of what was evicted.
        self._open: OrderedDict[int, Fingerprint] = OrderedDict()

    def prefix_renderer(
        self, chat: ChatRequest, *, tools: bool = True, tenant: str | None = None
    ) -> Callable[[int], list[int]]:
        """The tokens of ``chat``'s first ``k`` messages rendered (where message ``k`` starts),
        its images keyed as ``tenant``'s."""

        def prefix_tokens(k: int) -> list[int]:
            listed = chat.tools if tools else None
            text = self.renderer.render(chat.messages[:k], listed, chat.template_kwargs)
            images = chat.images[: _image_parts(chat.messages[:k])]
            return self.service.encode_prompt(text, images, tenant=tenant)

        return prefix_tokens

    def made(self, turn: ChatTurn, found: CachedPrefix | None) -> CacheReport | None:
        """The turn's report from ``found`` (what its restore used); off the loop."""
        if turn.chat is None:
            return None
        return self.report(
            turn.chat,
            turn.prompt.tokens,
            found,
            turn.controls,
            turn.divergence.part if turn.divergence is not None else None,
            turn.previous,
            turn.fingerprint,
        )

    def report(
        self,
        chat: ChatRequest,
        tokens: Sequence[int],
        found: CachedPrefix | None,
        controls: TurnControls,
        changed: str | None,
        previous: Fingerprint | None,
        current: Fingerprint,
    ) -> CacheReport | None:
        """``chat``'s report from ``found`` (a restore, or a probe for ``explain``): ``changed``
        is the part its previous turn (``previous``) says changed; off the loop."""
        if found is None:
            return None
        return self.controls.report(
            found,
            tokens,
            self.parts(chat, changed, controls.tenant),
            store=controls.store,
            session=controls.session,
            history=self.history(chat, tokens, previous, current),
        )

    def parts(self, chat: ChatRequest, changed: str | None, tenant: str | None) -> PromptParts:
        """What names ``chat``'s prompt parts in a report (``changed``: the part its previous
        turn says changed)."""
        prefix_tokens = self.prefix_renderer(chat, tenant=tenant)

        def tools_span() -> tuple[int, int]:
            bare = self.prefix_renderer(chat, tools=False, tenant=tenant)
            return tools_span_of(prefix_tokens(1), bare(1))

        return PromptParts(
            chat.messages,
            chat.labels,
            prefix_tokens,
            changed,
            tools_span if chat.tools else None,
        )

    def opened(self, fp: Fingerprint) -> None:
        """A turn with this fingerprint was prepared: until ``closed``, its prompt may not be
        computed yet (on the loop)."""
        self._open[id(fp)] = fp
        while len(self._open) > OPEN_TURNS_LIMIT:  # turns refused before they ran
            self._open.popitem(last=False)

    def closed(self, fp: Fingerprint) -> None:
        """The turn ran to its end, or left (what it computed is kept)."""
        self._open.pop(id(fp), None)

    def history(
        self,
        chat: ChatRequest,
        tokens: Sequence[int],
        previous: Fingerprint | None,
        current: Fingerprint,
    ) -> PromptHistory:
        """What the turn's conversation tells of its prompt: a first turn or not, how much its
        previous prompt shares (when that turn is done: one still running may not have
        computed it), and how much of it is the template's fixed preamble."""
        done = previous is not None and id(previous) not in self._open
        return PromptHistory(
            first_turn=first_turn(str(m.get("role", "")) for m in chat.messages),
            previous_shared=shared_tokens(previous.tokens, current.tokens) if done else 0,
            preamble=self.preamble(chat, tokens),
        )

    def preamble(self, chat: ChatRequest, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` are the template's fixed preamble: what every conversation
        of this shape (a leading system message or not) renders before its own words, such
        as a default system prompt. Measured once per model and shape; 0 when the template
        will not render the probes."""
        system = bool(chat.messages) and chat.messages[0].get("role") == "system"
        fixed = self._preambles.get(system)
        if fixed is None:
            fixed = self._preambles[system] = self._measure(system)
        return common_prefix(fixed, tokens)

    def _measure(self, system: bool) -> tuple[int, ...]:
        renderings = []
        for words in _PROBE_WORDS:
            first: list[JsonObject] = [{"role": "system", "content": words}] if system else []
            messages = [*first, {"role": "user", "content": "Hi." if system else words}]
            try:
                text = self.renderer.render(messages)
                renderings.append(self.service.encode_text(text))
            except (InvalidRequest, ValueError, TypeError):  # a template refusing the shape
                log.debug("the template did not render a one-message probe", exc_info=True)
                return ()
        a, b = renderings
        return tuple(a[: common_prefix(a, b)])

    def settle(self, turn: ChatTurn, report: CacheReport) -> None:
        """The turn's report is known: count it, and say why it restored less than its
        conversation's previous prompt shares (on the loop)."""
        turn.cache = report
        self.counted(report)
        prev = turn.previous
        if prev is None or turn.divergence is not None or id(prev) in self._open:
            return  # no previous turn done, or a changed part its diagnosis already counted
        shared = shared_tokens(prev.tokens, turn.fingerprint.tokens)
        expected = min(shared, len(turn.prompt.tokens) - 1)
        where = f"message {report.message} ({report.part or report.role})"
        if report.cached < expected:
            lost = expected - report.cached
            if report.outcome == IN_FLIGHT:
                log.debug(
                    "not a cache miss: %d of the %d tokens its conversation's previous prompt "
                    "shares were being computed by another request when this one started",
                    lost,
                    expected,
                )
            elif report.outcome == EVICTED:
                log.debug(
                    "cache miss: %d of the %d tokens its conversation's previous prompt shares "
                    "were restored; the rest was kept and has been evicted since (from token "
                    "%d, in %s)",
                    report.cached,
                    expected,
                    report.diverged_at,
                    where,
                )
                self.count_miss(EVICTED)
            else:
                log.debug(
                    "%d of the %d tokens its conversation's previous prompt shares are computed "
                    "again (%s at token %d, in %s)",
                    lost,
                    expected,
                    report.outcome,
                    report.diverged_at,
                    where,
                )
        elif shared < prev.n_tokens and report.diverged_at == shared:
            # The request's parts are those of its previous turn, yet the prompt parts
            # from it: the template renders an earlier turn differently now.
            log.debug(
                "cache miss: the prompt changed at token %d, in %s, though no part of the "
                "request did: the chat template renders it differently from the previous "
                "turn (%d previously computed tokens unusable)",
                shared,
                where,
                prev.n_tokens - shared,
            )
            self.count_miss("messages")

    def counted(self, report: CacheReport) -> CacheReport:
        """``report``, counted by outcome and by what it restored (any request's, any thread)."""
        if self.observer is not None:
            self.observer.cache_reported(report.outcome, report.restored)
        return report

    def count_miss(self, kind: str) -> None:
        if self.observer is not None:
            self.observer.cache_miss(kind)


def _image_parts(messages: list[JsonObject]) -> int:
    """How many image parts ``messages`` hold (the first that many of a request's images)."""
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    )
