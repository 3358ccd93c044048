"""The chat pipeline every API family shares: render → request → stream.

The OpenAI, Anthropic and Responses controllers translate their wire shapes into one
``ChatRequest``, and format the ``ChatEvent``s that come back; everything between (the
template, the token limits, cache-miss diagnostics, splitting the model's text into
reasoning, answer and tool calls) happens here once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import replace

import anyio

from omlx.app.cache_controls.controls import TurnControls
from omlx.app.cache_controls.outcome import first_turn
from omlx.app.cache_controls.report import CacheReport
from omlx.app.cache_controls.reporting import REPORT_HOLD_S, reported
from omlx.app.cache_controls.service import CacheControls
from omlx.app.cache_controls.session_key import SessionKey
from omlx.app.chat.constraints import ResponseFormat, forced_format, output_grammar
from omlx.app.chat.diagnostics import Fingerprint, FingerprintStore, compare, fingerprint
from omlx.app.chat.observers import CacheMissObserver
from omlx.app.chat.output import (
    OutputFormat,
    OutputSplitter,
    Piece,
    ToolCallArgs,
    ToolCallPiece,
    ToolCallStart,
)
from omlx.app.chat.sampling import Sampling
from omlx.app.chat.service import GenerationService
from omlx.app.chat.templates import ChatRenderer, RenderedPrompt
from omlx.app.chat.tool_calls import HERMES
from omlx.app.chat.turn import (
    ChatEvent,
    ChatRequest,
    ChatResult,
    ChatTurn,
    Done,
    Error,
    Output,
    Started,
    ToolChoice,
)
from omlx.app.chat.turn_reports import TurnReports
from omlx.app.errors import GenerationFailed, InvalidRequest
from omlx.domain.generation import (
    Failed,
    Finished,
    GenerationEvent,
    PrefillStarted,
    ReasoningBudget,
    TextDelta,
    TokenLogprob,
)
from omlx.domain.json_values import JsonObject

__all__ = [
    "ChatEvent",
    "ChatPipeline",
    "ChatRequest",
    "ChatTurn",
    "Done",
    "Error",
    "Output",
    "ResponseFormat",
    "Sampling",
    "Started",
    "ToolChoice",
]

log = logging.getLogger(__name__)


class ChatPipeline:
    """Renders chat turns for one model and runs them through its generation service."""

    def __init__(
        self,
        service: GenerationService,
        renderer: ChatRenderer,
        controls: CacheControls,
        *,
        fingerprints: FingerprintStore | None = None,
        observer: CacheMissObserver | None = None,
    ) -> None:
        self.service = service
        self.renderer = renderer
        self.controls = controls  # the model's cache controls: reports, pins
        self.native_format = OutputFormat.of(service.tokenizer)
        self.fingerprints = fingerprints or FingerprintStore()
        self.observer = observer  # told of cache misses and reports (metrics)
        self.reports = TurnReports(service, renderer, controls, observer)
        self.report_hold_s = REPORT_HOLD_S  # how long a stream's start waits for its report

    def check_images(self, chat: ChatRequest) -> None:
        """A model that reads no images is told none: 400 before anything is tokenized."""
        if not chat.image_sources:
            return
        if not self.service.accepts_images:
            raise InvalidRequest(
                f"model {chat.model!r} does not take images; serve a vision-language model "
                "for this request",
                param=chat.image_sources[0].part,
            )
        # Each {"type": "image"} part needs its pixels (Translators.read_images).
        assert len(chat.images) == len(chat.image_sources), "the request's images were not read"

    async def count_tokens(self, chat: ChatRequest) -> int:
        self.check_images(chat)

        def count() -> int:
            text = self.renderer.render(chat.messages, chat.tools, chat.template_kwargs)
            return len(self.service.encode_prompt(text, chat.images))

        return await anyio.to_thread.run_sync(count)

    async def start(
        self,
        chat: ChatRequest,
        response_id: str,
        controls: TurnControls,
        previous_id: str | None = None,
    ) -> ChatTurn:
        """A turn ready to run, its cache controls applied: rendered, reported, pinned.

        It is remembered as ``response_id``, and as its session's latest turn when the
        controls name a session (``prompt_cache_key``). ``previous_id`` names the
        conversation's previous turn for diagnostics; else the session's latest, else the
        recent turn sharing the longest prompt prefix.
        """
        session = _session_name(controls.session_key)
        tenant = controls.tenant
        if previous_id is None and session and self.fingerprints.get(tenant, session) is not None:
            previous_id = session
        turn = await self.prepare(chat, response_id, previous_id, controls)
        if session:
            self.fingerprints.record(tenant, session, turn.fingerprint)
        if controls.store and (controls.retention is not None or controls.breakpoints):
            pins = (turn.prompt.tokens, controls, self.prefix_renderer(chat, tenant=tenant))
            turn.cache_written = await anyio.to_thread.run_sync(self.controls.honour, *pins)
        return turn

    async def prepare(
        self,
        chat: ChatRequest,
        response_id: str,
        previous_id: str | None = None,
        controls: TurnControls | None = None,
    ) -> ChatTurn:
        """Render and validate ``chat``; the turn is remembered as ``response_id``.

        ``previous_id`` names the conversation's previous turn for diagnostics; without
        it, the recent turn sharing the longest prompt prefix is taken. Nothing is pinned
        (``start`` does that).
        """
        controls = controls if controls is not None else TurnControls()
        self.check_images(chat)
        started = time.monotonic()
        prompt, fp = await anyio.to_thread.run_sync(
            self._render, chat, controls.tenant, controls.store
        )
        request = self.service.build_request(prompt.tokens, chat.sampling, chat.images)
        fmt = self.format_for(chat.tools)
        in_reasoning = fmt.opens_in_reasoning(prompt.text)
        wanted = output_grammar(
            fmt=fmt,
            in_reasoning=in_reasoning,
            response_format=chat.response_format,
            tool_mode=chat.tool_choice.mode,
            tool_name=chat.tool_choice.name,
            tools=chat.tools,
            parallel=chat.parallel_tool_calls and chat.several_forced_calls,
        )
        grammar_seconds = 0.0
        if wanted is not None:
            grammar, param = wanted
            compiling = time.monotonic()
            request = await self.service.constrain(request, grammar, param)
            grammar_seconds = time.monotonic() - compiling
            if grammar.calls:  # read back in the syntax it was forced in
                fmt = fmt.with_calls(forced_format(fmt))
        if chat.reasoning_budget is not None and fmt.think is not None:
            request = replace(
                request, reasoning_budget=self._budget(chat.reasoning_budget, in_reasoning, fmt)
            )
        # Template and tokenizer, then the grammar: what came before the engine saw it.
        request = replace(
            request,
            render_seconds=time.monotonic() - started - grammar_seconds,
            grammar_seconds=grammar_seconds,
            images=chat.images,
        )
        splitter = OutputSplitter(
            fmt,
            parse_tools=chat.tool_choice.mode != "none" and bool(chat.tools),
            in_reasoning=in_reasoning,
            forced_name=_forced_name(chat) if wanted is not None and grammar.calls else None,
        )
        turn = ChatTurn(
            prompt, request, splitter, chat.parallel_tool_calls, fp, controls=controls, chat=chat
        )
        self._diagnose(turn, previous_id, chat)
        self.fingerprints.record(controls.tenant, response_id, fp)
        self.reports.opened(fp)  # until it is done, its prompt is no evidence of an eviction
        found = await anyio.to_thread.run_sync(self.controls.look, prompt.tokens, controls.tenant)
        # The probe's keys and index answer go with the request: it is looked up once. Its
        # report is made from what the engine restores (``stream``), not from this look.
        turn.request = self.controls.apply(request, controls, found)
        return turn

    def format_for(self, tools: list[JsonObject] | None) -> OutputFormat:
        """The output format of a turn: the model's own tool-call syntax, or the fallback's
        (Hermes) where its template shows the tools no other way."""
        if tools and not self.renderer.renders_tools():
            return self.native_format.with_calls(HERMES)
        return self.native_format

    async def explain(
        self, chat: ChatRequest, tenant: str | None, session: SessionKey | None = None
    ) -> tuple[list[int], CacheReport | None]:
        """``chat``'s prompt, and what ``tenant``'s cache holds of it and where it leaves it
        (``session``: the one the request named); nothing is run or remembered
        (``POST /v1/cache/explain``)."""
        self.check_images(chat)
        prompt, fp = await anyio.to_thread.run_sync(self._render, chat, tenant)
        previous = self.fingerprints.closest(tenant, fp)
        divergence = compare(previous, fp) if previous is not None else None
        changed = divergence.part if divergence is not None else None
        controls = TurnControls(tenant=tenant, session=session)

        def probed() -> CacheReport | None:
            found = self.controls.look(prompt.tokens, tenant)
            return self.reports.report(chat, prompt.tokens, found, controls, changed, previous, fp)

        return prompt.tokens, await anyio.to_thread.run_sync(probed)

    def prefix_renderer(
        self, chat: ChatRequest, *, tools: bool = True, tenant: str | None = None
    ) -> Callable[[int], list[int]]:
        """The tokens of ``chat``'s first ``k`` messages rendered (where message ``k`` starts),
        its images keyed as ``tenant``'s."""
        return self.reports.prefix_renderer(chat, tools=tools, tenant=tenant)

    def _budget(self, tokens: int, opened: bool, fmt: OutputFormat) -> ReasoningBudget:
        start, end = fmt.think
        encode = self.service.encode_text
        return ReasoningBudget(tokens, tuple(encode(start)), tuple(encode(end)), opened)

    def _render(
        self, chat: ChatRequest, tenant: str | None = None, store: bool | None = None
    ) -> tuple[RenderedPrompt, Fingerprint]:
        """The prompt's text and tokens (its images keyed as ``tenant``'s, registered with
        ``store``: None for a prompt that is not run) and its fingerprint."""
        text = self.renderer.render(chat.messages, chat.tools, chat.template_kwargs)
        tokens = self.service.encode_prompt(text, chat.images, tenant=tenant, store=store)
        fp = fingerprint(chat.model, chat.messages, chat.labels, chat.tools, tokens, chat.images)
        return RenderedPrompt(text, tokens), fp

    def _diagnose(self, turn: ChatTurn, previous_id: str | None, chat: ChatRequest) -> None:
        if previous_id is not None:
            turn.previous = self.fingerprints.get(turn.controls.tenant, previous_id)
            turn.previous_named = True
        else:
            turn.previous = self.fingerprints.closest(turn.controls.tenant, turn.fingerprint)
        if turn.previous is None:
            return
        divergence = compare(turn.previous, turn.fingerprint)
        # Found by prefix, a difference at the request's newest message is a new branch
        # of the conversation, and one in a first turn (no answer yet) a new conversation
        # sharing a system prompt: neither is a miss.
        newest = chat.labels[-1] if chat.labels else ""
        if (
            divergence is not None
            and not turn.previous_named
            and (divergence.part == newest or first_turn(m.get("role", "") for m in chat.messages))
        ):
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
            self.reports.count_miss(divergence.kind)

    def _settle(self, turn: ChatTurn, report: CacheReport) -> None:
        """The turn's report is known (the engine restored its prefix): counted, logged, and
        handed to the edge that sends it."""
        self.reports.settle(turn, report)
        if turn.on_report is not None:
            turn.on_report(report)

    def stream(
        self, turn: ChatTurn, keepalive: float | None = None
    ) -> AsyncGenerator[ChatEvent | None, None]:
        """The turn's events; ``None`` after ``keepalive`` quiet seconds. Leaving early cancels it.

        A full queue is a 429 now, before the stream starts (``GenerationService.stream``).
        ``Started`` comes once the turn's cache report is made and handed to
        ``turn.on_report``; keepalives before it wait (``reporting.reported``).
        """
        events = reported(
            self.service.stream(turn.request, keepalive),
            lambda started: self.reports.made(turn, self.controls.restored(started)),
            lambda report: self._settle(turn, report),
            self.report_hold_s,
        )
        return self._chat_events(turn, events)

    async def _chat_events(
        self, turn: ChatTurn, events: AsyncIterator[GenerationEvent | None]
    ) -> AsyncGenerator[ChatEvent | None, None]:
        try:
            async for event in events:
                if event is None:
                    yield None
                elif isinstance(event, PrefillStarted):
                    turn.cached_tokens = event.cached_tokens
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
        finally:
            self.reports.closed(turn.fingerprint)  # done, or left: what it computed is kept

    async def complete(self, turn: ChatTurn) -> ChatResult:
        """Run to the end: every piece, and how it finished."""
        pieces: list[Piece] = []
        logprobs: list[TokenLogprob] = []
        events = self.stream(turn)
        try:
            async for event in events:
                if isinstance(event, Output):
                    pieces.extend(_whole(event.pieces))
                    logprobs.extend(event.logprobs)
                elif isinstance(event, Done):
                    return ChatResult(
                        [*pieces, *_whole(event.pieces)],
                        event.finished,
                        event.tool_calls,
                        tuple(logprobs),
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
            if isinstance(piece, ToolCallStart | ToolCallArgs | ToolCallPiece):
                if piece.index > 0 and not turn.parallel_tool_calls:
                    continue
                if isinstance(piece, ToolCallPiece):
                    turn.tool_calls += 1
            kept.append(piece)
        return kept


def _session_name(key: str | None) -> str | None:
    """Where a ``prompt_cache_key`` session's latest turn is remembered."""
    return f"prompt_cache_key:{key}" if key else None


def _forced_name(chat: ChatRequest) -> str | None:
    """The one tool a forced call can name (a call cut before its name is still that call)."""
    if chat.tool_choice.mode == "function":
        return chat.tool_choice.name
    names = {t["function"]["name"] for t in chat.tools or ()}
    return names.pop() if len(names) == 1 else None


def _whole(pieces: list[Piece]) -> list[Piece]:
    """Pieces less the streamed fragments of calls: a whole answer has its calls whole."""
    return [
        replace(p, streamed=False) if isinstance(p, ToolCallPiece) else p
        for p in pieces
        if not isinstance(p, ToolCallStart | ToolCallArgs)
    ]


def check_tool_choice(choice: ToolChoice, tools: list[JsonObject] | None) -> None:
    """Tool choices that name what is not there are the client's mistake."""
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequest(f"tool_choice {choice.mode!r} needs tools", param="tool_choice")
    if choice.mode == "function":
        names = {t["function"]["name"] for t in tools or ()}
        if choice.name not in names:
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not in tools", param="tool_choice"
            )
