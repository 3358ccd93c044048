"""A chat turn's values: the API-neutral request, the prepared turn, and the events it reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from omlx.app.cache_controls.controls import TurnControls
from omlx.app.cache_controls.report import CacheReport
from omlx.app.chat.constraints import ResponseFormat
from omlx.app.chat.diagnostics import Divergence, Fingerprint
from omlx.app.chat.image_parts import ImageSource
from omlx.app.chat.output import OutputSplitter, Piece
from omlx.app.chat.sampling import Sampling
from omlx.app.chat.templates import RenderedPrompt
from omlx.domain.generation import Finished, GenerationRequest, TokenLogprob
from omlx.domain.images import PromptImage
from omlx.domain.json_values import JsonObject


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``auto`` (the model decides), ``none``, ``required`` or ``function`` (``name``)."""

    mode: str = "auto"
    name: str | None = None


@dataclass(slots=True)
class ChatRequest:
    """One chat turn in API-neutral form: chat-template messages and generation settings.

    ``labels[i]`` names the part of the client's request ``messages[i]`` came from
    ("system" or "messages[k]"), for cache-miss diagnostics. A message holding images has
    a list of ``{"type": "text"}`` and ``{"type": "image"}`` parts as its content; the i-th
    image part, counted across the messages in order, is ``images[i]``.
    """

    model: str  # the served model id
    messages: list[JsonObject]
    labels: list[str]
    tools: list[JsonObject] | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    sampling: Sampling = field(default_factory=Sampling)
    template_kwargs: JsonObject = field(default_factory=dict)
    parallel_tool_calls: bool = True
    # A forced call may be several only when asked for outright (parallel_tool_calls: true):
    # forced, a small model calls again and again until max_tokens.
    several_forced_calls: bool = False
    response_format: ResponseFormat | None = None  # the answer as JSON (structured output)
    reasoning_budget: int | None = None  # most reasoning tokens before the end marker is forced
    # The images as the client sent them (translators), then decoded (Translators.read_images).
    image_sources: tuple[ImageSource, ...] = ()
    images: tuple[PromptImage, ...] = ()


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
    # What the cache held of its prompt, from the engine's restore (once it started).
    cache: CacheReport | None = None
    controls: TurnControls = field(default_factory=TurnControls)
    cache_written: int = 0  # prompt tokens its cache_control breakpoints pinned (Anthropic usage)
    chat: ChatRequest | None = None  # what it was rendered from (its report names messages)
    # Told the report once it is known (the HTTP edge: the header, the recent reports).
    on_report: Callable[[CacheReport], None] | None = None


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
