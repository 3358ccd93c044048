"""Splits a model's streamed text into reasoning, answer text and tool calls.

The reasoning markers come from mlx-lm's tokenizer wrapper (``think_start``/``think_end``);
the tool-call syntax from the model's family (``tool_calls.formats``). A call whose
arguments are one JSON object streams: a ``ToolCallStart`` once its name is known, then
``ToolCallArgs`` fragments as the model writes them, then the whole ``ToolCallPiece``
(which says whether the streamed pieces already carried it). All APIs format these pieces.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from omlx.app.chat.tool_calls import (
    HERMES,
    ToolCallFormat,
    format_of_template,
    opaque_format,
    value_end,
)
from omlx.app.chat.tool_calls import formats as families

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Content:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A call began: its name is known, its arguments follow as ``ToolCallArgs``."""

    index: int
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgs:
    index: int
    text: str  # the next fragment of the arguments' JSON text


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    """A whole call. ``complete`` False: the output was cut inside its arguments (partial
    JSON); ``streamed``: a ``ToolCallStart`` and ``ToolCallArgs`` already carried it."""

    name: str
    arguments: str  # JSON text, as the APIs' clients expect to parse it
    index: int = 0
    complete: bool = True
    streamed: bool = False


Piece = Reasoning | Content | ToolCallStart | ToolCallArgs | ToolCallPiece

# mlx-lm's tool parsers (``tokenizer.tool_parser``) whose syntax omlx writes itself.
_KNOWN_PARSERS = {
    "json_tools": HERMES,
    "mistral": families.MISTRAL_ARGS,
    "glm47": families.GLM,
    "gemma4": families.GEMMA4,
    "function_gemma": families.FUNCTION_GEMMA,
}


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """What a model's output may contain besides plain text."""

    think: tuple[str, str] | None = None
    calls: ToolCallFormat | None = field(default=None, compare=False)

    @classmethod
    def of(cls, tokenizer: Any) -> OutputFormat:
        think = None
        if (
            getattr(tokenizer, "has_thinking", False)
            and tokenizer.think_start
            and tokenizer.think_end
        ):
            think = (tokenizer.think_start, tokenizer.think_end)
        calls = calls_of(tokenizer)
        if think is None and calls is not None:
            think = calls.think
        return cls(think, calls)

    def with_calls(self, calls: ToolCallFormat) -> OutputFormat:
        return OutputFormat(self.think, calls)

    def opens_in_reasoning(self, prompt_text: str) -> bool:
        """Whether the rendered prompt leaves a thinking section open (templates that prefill it)."""
        if self.think is None:
            return False
        return prompt_text.rfind(self.think[0]) > prompt_text.rfind(self.think[1])


def calls_of(tokenizer: Any) -> ToolCallFormat | None:
    """The model's tool-call format: from its chat template, else from mlx-lm's parser."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(str(v) for v in template.values())
    found = format_of_template(template) if isinstance(template, str) else None
    if found is not None:
        return found
    parser = getattr(tokenizer, "tool_parser", None)
    if not getattr(tokenizer, "has_tool_calling", False) or parser is None:
        return None
    module = (getattr(parser, "__module__", "") or "").rpartition(".")[2]
    if module in _KNOWN_PARSERS:
        return _KNOWN_PARSERS[module]
    return opaque_format(tokenizer.tool_call_start, tokenizer.tool_call_end or "", parser)


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


@dataclass(slots=True)
class _OpenCall:
    index: int
    name: str
    at: int  # where its arguments start in the section's text
    sent: int  # up to where they were streamed
    text: str = ""


_LEADING_CALL = re.compile(r'\{\s*"name"')


class OutputSplitter:
    """Feed text deltas, get pieces; holds back text that may be the start of a marker."""

    def __init__(
        self,
        fmt: OutputFormat,
        *,
        parse_tools: bool = True,
        in_reasoning: bool = False,
        forced_name: str | None = None,
    ) -> None:
        self._fmt = fmt
        self._forced_name = forced_name  # a forced call's tool, when only one can be called
        self._calls = fmt.calls if parse_tools else None
        self._state = "reasoning" if in_reasoning and fmt.think else "text"
        self._held = ""
        self._strip = False  # drop the whitespace a model puts after </think> or a tool call
        self._leading = self._calls is not None and self._calls.leading_json
        self._opener = ""  # the marker that opened the tool section
        self._body = ""  # the open tool section's text
        self._scan = 0  # where in it the next call's header is looked for
        self._open: _OpenCall | None = None
        self._streamed: list[ToolCallPiece] = []  # this section's calls, streamed
        self._next = 0  # the next call's index in the turn
        self.tool_calls = 0

    def _markers(self) -> dict[str, str]:
        """Marker -> next state ("drop": framing, removed), for the current state."""
        fmt, calls = self._fmt, self._calls
        if self._state == "reasoning":
            return {fmt.think[1]: "text"}
        if self._state == "tool":
            return {calls.end: "text"} if calls.end else {}
        out: dict[str, str] = {}
        if fmt.think:
            out[fmt.think[0]] = "reasoning"
        if calls is not None:
            out.update(dict.fromkeys(calls.framing, "drop"))
            out[calls.start] = "tool"
        return out

    def feed(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        buffer = self._held + text
        while buffer:
            if self._leading and self._state == "text":
                buffer, wait = self._leading_call(buffer, pieces)
                if wait:
                    break
                continue
            markers = self._markers()
            found = min(((buffer.find(m), m) for m in markers if m in buffer), default=None)
            if found is None:
                keep = _partial_suffix(buffer, markers)
                self._emit(buffer[: len(buffer) - keep], pieces)
                buffer = buffer[len(buffer) - keep :]
                break
            at, marker = found
            self._emit(buffer[:at], pieces)
            if markers[marker] != "drop":
                self._switch(markers[marker], marker, pieces)
            buffer = buffer[at + len(marker) :]
        self._held = buffer
        return pieces

    def _leading_call(self, buffer: str, pieces: list[Piece]) -> tuple[str, bool]:
        """A JSON call opening the answer (Llama 3.x): (what is left, whether to wait for more)."""
        stripped = buffer.lstrip()
        if not stripped:
            return buffer, True
        if _LEADING_CALL.match(stripped):
            self._leading = False
            self._switch("tool", "", pieces)
            self._emit(stripped, pieces)
            return "", False
        if re.fullmatch(r'\{\s*"?(n(a(m(e)?)?)?)?', stripped):
            return buffer, True
        self._leading = False
        return buffer, False

    def finish(self) -> list[Piece]:
        """Flush what is held; an unterminated tool section is read as far as it goes."""
        pieces: list[Piece] = []
        held, self._held = self._held, ""
        self._leading = False
        self._emit(held, pieces)
        if self._state == "tool":
            self._close_section(pieces, terminated=False)
            self._state = "text"
        return pieces

    def _emit(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        if self._state == "tool":
            self._body += text
            self._stream(pieces)
            return
        if self._strip:
            text = text.lstrip()
            if not text:
                return
            self._strip = False
        if self._state == "text":
            self._leading = False
        pieces.append(Reasoning(text) if self._state == "reasoning" else Content(text))

    def _switch(self, state: str, marker: str, pieces: list[Piece]) -> None:
        if self._state == "tool":
            self._close_section(pieces, terminated=True)
        elif state == "tool":
            self._opener = marker
        self._state = state
        self._strip = state == "text"

    def _stream(self, pieces: list[Piece]) -> None:
        """Calls whose header is complete start; their arguments go out as written."""
        header = self._calls.header
        if header is None:
            return
        body = self._body
        while True:
            if self._open is None:
                found = header(body, self._scan)
                if found is None:
                    return
                name, at, _ = found
                self._open = _OpenCall(self._next, name, at, at)
                self._next += 1
                pieces.append(ToolCallStart(self._open.index, name))
            call = self._open
            end = value_end(body, call.at)
            upto = end if end is not None else len(body)
            fragment = body[call.sent : upto]
            if not call.text:
                fragment = fragment.lstrip()
            if fragment:
                pieces.append(ToolCallArgs(call.index, fragment))
                call.text += fragment
            call.sent = upto
            if end is None:
                return
            self._streamed.append(ToolCallPiece(call.name, call.text, call.index, True, True))
            self._open, self._scan = None, end

    def _close_section(self, pieces: list[Piece], terminated: bool) -> None:
        calls = self._calls
        body, streamed, cut = self._body, self._streamed, self._open
        self._body, self._streamed, self._open, self._scan = "", [], None, 0
        if cut is not None:
            streamed.append(ToolCallPiece(cut.name, cut.text, cut.index, False, True))
        if streamed:
            self.tool_calls += len(streamed)
            pieces.extend(streamed)
            return
        try:
            parsed = calls.parse(body)
        except ValueError as exc:
            log.warning("unparsable tool call (%s); returned as text", exc)
            parsed = None
        except Exception as exc:  # a family's parser raises anything on a malformed body
            log.warning("unparsable tool call (%s: %s); returned as text", type(exc).__name__, exc)
            parsed = None
        if not parsed and not terminated and self._forced_name is not None:
            # A forced call cut before its arguments began (max_tokens): still that call.
            pieces.append(ToolCallPiece(self._forced_name, "", self._next, complete=False))
            self._next += 1
            self.tool_calls += 1
            return
        if not parsed:
            end = calls.end if terminated else ""
            pieces.append(Content(self._opener + body + end))
            return
        open_ended = not terminated and bool(calls.end)  # its end marker never came
        for i, (name, arguments) in enumerate(parsed):
            complete = not (open_ended and i == len(parsed) - 1)
            pieces.append(ToolCallPiece(name, arguments_text(arguments), self._next, complete))
            self._next += 1
        self.tool_calls += len(parsed)


def _partial_suffix(buffer: str, markers: dict[str, str]) -> int:
    """Length of the longest suffix of ``buffer`` that starts some marker."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(buffer)), longest, -1):
            if buffer.endswith(marker[:n]):
                longest = n
                break
    return longest


def collect(pieces: list[Piece]) -> tuple[str, str, list[ToolCallPiece]]:
    """Answer text, reasoning text and tool calls of a whole response."""
    text = "".join(p.text for p in pieces if isinstance(p, Content))
    reasoning = "".join(p.text for p in pieces if isinstance(p, Reasoning))
    return text, reasoning, [p for p in pieces if isinstance(p, ToolCallPiece)]
