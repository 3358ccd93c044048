"""The chat pipeline every API family shares: render → request → stream.

The OpenAI, Anthropic and Responses controllers translate their wire shapes into one
``ChatRequest``, and format the ``ChatEvent``s that come back; everything between (the
template, the token limits, cache-miss diagnostics, splitting the model's text into
reasoning, answer and tool calls) happens here once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from omlx.app.cache_report import CacheReport, report, tools_span_of
from omlx.app.constraints import ResponseFormat, output_grammar
from omlx.app.diagnostics import Divergence, Fingerprint, FingerprintStore, compare, fingerprint
from omlx.app.errors import GenerationFailed, InvalidRequest
from omlx.app.output import OutputFormat, OutputSplitter, Piece, ToolCallPiece
from omlx.app.sampling import Sampling
from omlx.app.service import GenerationService
from omlx.app.templates import ChatRenderer, RenderedPrompt
from omlx.domain.generation import (
    Failed,
    Finished,
    GenerationRequest,
    PrefillStarted,
    ReasoningBudget,
    TextDelta,
    TokenLogprob,
)

__all__ = [
    "ChatEvent",
    "ChatPipeline",
    "ChatRequest",
    "Done",
    "Error",
    "Output",
    "ResponseFormat",
    "Sampling",
    "Started",
    "ToolChoice",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``auto`` (the model decides), ``none``, ``required`` or ``function`` (``name``)."""

    mode: str = "auto"
    name: str | None = None


@dataclass(slots=True)
class ChatRequest:
    """One chat turn in API-neutral form: chat-template messages and generation settings.

    ``labels[i]`` names the part of the client's request ``messages[i]`` came from
    ("system" or "messages[k]"), for cache-miss diagnostics.
    """

    model: str  # the served model id
    messages: list[dict[str, Any]]
    labels: list[str]
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    sampling: Sampling = field(default_factory=Sampling)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None  # the answer as JSON (structured output)
    reasoning_budget: int | None = None  # most reasoning tokens before the end marker is forced
    cache_tenant: str | None = None  # the API key's tenant: its own cache namespace


@dataclass(slots=True)
class ChatTurn:
    """A rendered, validated turn, ready to run."""

    prompt: RenderedPrompt
    request: GenerationRequest
    splitter: OutputSplitter
    parallel_tool_calls: bool
    fingerprint: Fingerprint
    divergence: Divergence | None = None  # vs the conversation's previous turn
    previous: Fingerprint | None = None
    previous_named: bool = False  # the client named the previous turn (vs found by prefix)
    cached_tokens: int | None = None  # known once the engine started it
    tool_calls: int = 0
    cache: CacheReport | None = None  # what the cache held of its prompt on arrival


# What a running turn reports, in order: Started, then Output..., then Done or Error.
@dataclass(frozen=True, slots=True)
class Started:
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Output:
    pieces: list[Piece]
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens since the previous event


@dataclass(frozen=True, slots=True)
class Done:
    finished: Finished
    pieces: list[Piece]  # the last pieces the splitter held back
    tool_calls: int


@dataclass(frozen=True, slots=True)
class Error:
    message: str


ChatEvent = Started | Output | Done | Error


@dataclass(frozen=True, slots=True)
class ChatResult:
    pieces: list[Piece]
    finished: Finished
    tool_calls: int
    logprobs: tuple[TokenLogprob, ...] = ()


class ChatPipeline:
    """Renders chat turns for one model and runs them through its generation service."""

    def __init__(
        self,
        service: GenerationService,
        renderer: ChatRenderer,
        fingerprints: FingerprintStore | None = None,
    ) -> None:
        self.service = service
        self.renderer = renderer
        self.format = OutputFormat.of(service.tokenizer)
        self.fingerprints = fingerprints or FingerprintStore()
        self.observer: Any = None  # has cache_miss(kind); set by the API's metrics

    async def count_tokens(self, chat: ChatRequest) -> int:
        text = await anyio.to_thread.run_sync(
            self.renderer.render, chat.messages, chat.tools, chat.template_kwargs
        )
        return len(self.service.encode_text(text))

    async def prepare(
        self, chat: ChatRequest, response_id: str, previous_id: str | None = None
    ) -> ChatTurn:
        """Render and validate ``chat``; the turn is remembered as ``response_id``.

        ``previous_id`` names the conversation's previous turn for diagnostics; without
        it, the recent turn sharing the longest prompt prefix is taken.
        """
        started = time.monotonic()
        prompt, fp = await anyio.to_thread.run_sync(self._render, chat)
        request = self.service.build_request(prompt.tokens, chat.sampling)
        in_reasoning = self.format.opens_in_reasoning(prompt.text)
        wanted = output_grammar(
            fmt=self.format,
            in_reasoning=in_reasoning,
            response_format=chat.response_format,
            tool_mode=chat.tool_choice.mode,
            tool_name=chat.tool_choice.name,
            tools=chat.tools,
            parallel=chat.parallel_tool_calls,
        )
        if wanted is not None:
            grammar, param = wanted
            request = await self.service.constrain(request, grammar, param)
        if chat.reasoning_budget is not None and self.format.think is not None:
            request = replace(request, reasoning_budget=self._budget(chat.reasoning_budget, in_reasoning))
        # Template, tokenizer and grammar: what came before the engine saw the request.
        request = replace(
            request, render_seconds=time.monotonic() - started, cache_tenant=chat.cache_tenant
        )
        splitter = OutputSplitter(
            self.format,
            tools=chat.tools,
            parse_tools=chat.tool_choice.mode != "none" and bool(chat.tools),
            in_reasoning=in_reasoning,
            bare_call=wanted is not None and bool(grammar.tools) and grammar.call_markers is None,
        )
        turn = ChatTurn(prompt, request, splitter, chat.parallel_tool_calls, fp)
        self._diagnose(turn, previous_id, last_label=chat.labels[-1] if chat.labels else "")
        self.fingerprints.record(response_id, fp)
        changed = turn.divergence.part if turn.divergence is not None else None
        turn.cache = await anyio.to_thread.run_sync(self._report, chat, prompt.tokens, changed)
        return turn

    async def explain(self, chat: ChatRequest) -> tuple[list[int], CacheReport | None]:
        """What the cache holds of ``chat``'s prompt and where it leaves it; nothing is run
        or remembered (``POST /v1/cache/explain``)."""
        prompt, fp = await anyio.to_thread.run_sync(self._render, chat)
        previous = self.fingerprints.closest(fp)
        divergence = compare(previous, fp) if previous is not None else None
        changed = divergence.part if divergence is not None else None
        cache = await anyio.to_thread.run_sync(self._report, chat, prompt.tokens, changed)
        return prompt.tokens, cache

    def prefix_renderer(
        self, chat: ChatRequest, *, tools: bool = True
    ) -> Callable[[int], list[int]]:
        """The tokens of ``chat``'s first ``k`` messages rendered (where message ``k`` starts)."""

        def prefix_tokens(k: int) -> list[int]:
            listed = chat.tools if tools else None
            text = self.renderer.render(chat.messages[:k], listed, chat.template_kwargs)
            return self.service.encode_text(text)

        return prefix_tokens

    def _report(
        self, chat: ChatRequest, tokens: list[int], changed_part: str | None
    ) -> CacheReport | None:
        """The turn's ``x-omlx-cache`` report (``cache_report``), off the event loop."""

        prefix_tokens = self.prefix_renderer(chat)

        def tools_span() -> tuple[int, int]:
            return tools_span_of(prefix_tokens(1), self.prefix_renderer(chat, tools=False)(1))

        return report(
            getattr(self.service.engine, "prefix_cache", None),
            tokens,
            lambda tokens: self.service.tokenizer.decode(list(tokens)),
            tenant=chat.cache_tenant,
            messages=chat.messages,
            labels=chat.labels,
            prefix_tokens=prefix_tokens,
            changed_part=changed_part,
            tools_span=tools_span if chat.tools else None,
        )

    def _budget(self, tokens: int, opened: bool) -> ReasoningBudget:
        start, end = self.format.think
        encode = self.service.encode_text
        return ReasoningBudget(tokens, tuple(encode(start)), tuple(encode(end)), opened)

    def _render(self, chat: ChatRequest) -> tuple[RenderedPrompt, Fingerprint]:
        text = self.renderer.render(chat.messages, chat.tools, chat.template_kwargs)
        tokens = self.service.encode_text(text)
        fp = fingerprint(chat.model, chat.messages, chat.labels, chat.tools, tokens)
        return RenderedPrompt(text, tokens), fp

    def _diagnose(self, turn: ChatTurn, previous_id: str | None, last_label: str) -> None:
        if previous_id is not None:
            turn.previous, turn.previous_named = self.fingerprints.get(previous_id), True
        else:
            turn.previous = self.fingerprints.closest(turn.fingerprint)
        if turn.previous is None:
            return
        divergence = compare(turn.previous, turn.fingerprint)
        # Found by prefix, a difference at the request's newest message is a new branch
        # of the conversation (a new session sharing a system prompt), not a miss.
        if divergence is not None and not turn.previous_named and divergence.part == last_label:
            divergence = None
        turn.divergence = divergence
        if divergence is not None:
            log.debug(
                "cache miss: the prompt left its conversation's previous one in %s at token %d "
                "(%d previously cached tokens unusable)",
                divergence.part,
                divergence.token,
                divergence.missed_tokens,
            )
            self._count_miss(divergence.kind)

    def _started(self, turn: ChatTurn, cached: int) -> None:
        """Knowing what the engine restored: a prefix it should have had but lost is a miss too."""
        turn.cached_tokens = cached
        prev = turn.previous
        if prev is None or turn.divergence is not None:
            return
        expected = min(prev.n_tokens, len(turn.prompt.tokens) - 1)
        if cached < expected:
            log.debug(
                "cache miss: %d of the %d tokens its conversation's previous prompt shares were "
                "restored (the rest was evicted, or never stored)",
                cached,
                expected,
            )
            self._count_miss("not_cached")

    def _count_miss(self, kind: str) -> None:
        if self.observer is not None:
            self.observer.cache_miss(kind)

    async def run(
        self, turn: ChatTurn, keepalive: float | None = None
    ) -> AsyncIterator[ChatEvent | None]:
        """The turn's events; ``None`` after ``keepalive`` quiet seconds. Leaving early cancels it."""
        async for event in self.service.events(turn.request, keepalive):
            if event is None:
                yield None
            elif isinstance(event, PrefillStarted):
                self._started(turn, event.cached_tokens)
                yield Started(event.prompt_tokens, event.cached_tokens)
            elif isinstance(event, TextDelta):
                pieces = self._limit_calls(turn, turn.splitter.feed(event.text))
                if pieces or event.logprobs:
                    yield Output(pieces, event.logprobs)
            elif isinstance(event, Finished):
                pieces = self._limit_calls(turn, turn.splitter.finish())
                yield Done(event, pieces, turn.tool_calls)
            elif isinstance(event, Failed):
                yield Error(event.message)

    async def complete(self, turn: ChatTurn) -> ChatResult:
        """Run to the end: every piece, and how it finished."""
        pieces: list[Piece] = []
        logprobs: list[TokenLogprob] = []
        events = self.run(turn)
        try:
            async for event in events:
                if isinstance(event, Output):
                    pieces.extend(event.pieces)
                    logprobs.extend(event.logprobs)
                elif isinstance(event, Done):
                    return ChatResult(
                        [*pieces, *event.pieces], event.finished, event.tool_calls, tuple(logprobs)
                    )
                elif isinstance(event, Error):
                    raise GenerationFailed(event.message)
        finally:
            await events.aclose()
        raise GenerationFailed("generation ended without a result")

    @staticmethod
    def _limit_calls(turn: ChatTurn, pieces: list[Piece]) -> list[Piece]:
        """Count tool calls; with parallel_tool_calls off, keep only the first."""
        kept = []
        for piece in pieces:
            if isinstance(piece, ToolCallPiece):
                if turn.tool_calls and not turn.parallel_tool_calls:
                    continue
                turn.tool_calls += 1
            kept.append(piece)
        return kept


def check_tool_choice(choice: ToolChoice, tools: list[dict[str, Any]] | None) -> None:
    """Tool choices that name what is not there are the client's mistake."""
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequest(f"tool_choice {choice.mode!r} needs tools", param="tool_choice")
    if choice.mode == "function":
        names = {t["function"]["name"] for t in tools or ()}
        if choice.name not in names:
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not in tools", param="tool_choice"
            )
