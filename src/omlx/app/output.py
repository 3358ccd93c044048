"""Splits a model's streamed text into reasoning, answer text and tool calls.

The markers come from mlx-lm's tokenizer wrapper (``think_start``/``think_end``,
``tool_call_start``/``tool_call_end``) and tool-call bodies are parsed with its
``tool_parser`` for the model's family; both APIs format the same pieces.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Content:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    name: str
    arguments: str  # JSON text, as both APIs' clients expect to parse it


Piece = Reasoning | Content | ToolCallPiece


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """What a model's output may contain besides plain text."""

    think: tuple[str, str] | None = None
    tool: tuple[str, str] | None = None
    tool_parser: Callable[[str, Any], Any] | None = None

    @classmethod
    def of(cls, tokenizer: Any) -> OutputFormat:
        think = tool = None
        if (
            getattr(tokenizer, "has_thinking", False)
            and tokenizer.think_start
            and tokenizer.think_end
        ):
            think = (tokenizer.think_start, tokenizer.think_end)
        parser = getattr(tokenizer, "tool_parser", None)
        if getattr(tokenizer, "has_tool_calling", False) and parser is not None:
            tool = (tokenizer.tool_call_start, tokenizer.tool_call_end)
        return cls(think, tool, parser if tool else None)

    def opens_in_reasoning(self, prompt_text: str) -> bool:
        """Whether the rendered prompt leaves a thinking section open (templates that prefill it)."""
        if self.think is None:
            return False
        return prompt_text.rfind(self.think[0]) > prompt_text.rfind(self.think[1])


def parse_tool_text(
    parser: Callable[[str, Any], Any], text: str, tools: list[dict] | None
) -> list[ToolCallPiece] | None:
    """The calls in one tool-call body, or None when the model wrote something unparsable."""
    try:
        parsed = parser(text, tools)
    except Exception as exc:  # parsers raise anything on a truncated or malformed body
        log.warning("unparsable tool call (%s: %s); returned as text", type(exc).__name__, exc)
        return None
    calls = []
    for item in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCallPiece(item["name"], arguments))
    return calls


class OutputSplitter:
    """Feed text deltas, get pieces; holds back text that may be the start of a marker."""

    def __init__(
        self,
        fmt: OutputFormat,
        *,
        tools: list[dict] | None = None,
        parse_tools: bool = True,
        in_reasoning: bool = False,
        bare_call: bool = False,
    ) -> None:
        self._fmt = fmt
        self._tools = tools
        self._parse_tools = parse_tools and fmt.tool is not None and not bare_call
        # The answer is one JSON call (a forced call for a model without JSON call markers).
        self._bare_call = bare_call
        self._state = "reasoning" if in_reasoning and fmt.think else "text"
        self._held = ""
        self._tool_text = ""
        self._strip = False  # drop the whitespace a model puts after </think> or a tool call
        self.tool_calls = 0

    def _markers(self) -> dict[str, str]:
        """Marker -> next state, for the current state."""
        fmt = self._fmt
        if self._state == "reasoning":
            return {fmt.think[1]: "text"}
        if self._state == "tool":
            return {fmt.tool[1]: "text"}
        out: dict[str, str] = {}
        if fmt.think:
            out[fmt.think[0]] = "reasoning"
        if self._parse_tools:
            out[fmt.tool[0]] = "tool"
        return out

    def feed(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        buffer = self._held + text
        while buffer:
            markers = self._markers()
            found = min(((buffer.find(m), m) for m in markers if m in buffer), default=None)
            if found is None:
                keep = _partial_suffix(buffer, markers)
                self._emit(buffer[: len(buffer) - keep], pieces)
                buffer = buffer[len(buffer) - keep :]
                break
            at, marker = found
            self._emit(buffer[:at], pieces)
            self._switch(markers[marker], pieces)
            buffer = buffer[at + len(marker) :]
        self._held = buffer
        return pieces

    def finish(self) -> list[Piece]:
        """Flush what is held; an unterminated tool call is parsed if it can be."""
        pieces: list[Piece] = []
        held, self._held = self._held, ""
        self._emit(held, pieces)
        if self._state == "tool":
            self._close_tool(pieces, terminated=False)
            self._state = "text"
        if self._bare_call:
            self._close_bare_call(pieces)
        return pieces

    def _emit(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        if self._state == "tool" or (self._bare_call and self._state == "text"):
            self._tool_text += text
            return
        if self._strip:
            text = text.lstrip()
            if not text:
                return
            self._strip = False
        pieces.append(Reasoning(text) if self._state == "reasoning" else Content(text))

    def _switch(self, state: str, pieces: list[Piece]) -> None:
        if self._state == "tool":
            self._close_tool(pieces, terminated=True)
        self._state = state
        self._strip = state == "text"

    def _close_tool(self, pieces: list[Piece], terminated: bool) -> None:
        body, self._tool_text = self._tool_text, ""
        calls = parse_tool_text(self._fmt.tool_parser, body, self._tools)
        if calls is None:
            start, end = self._fmt.tool
            pieces.append(Content(start + body + (end if terminated else "")))
            return
        self.tool_calls += len(calls)
        pieces.extend(calls)


    def _close_bare_call(self, pieces: list[Piece]) -> None:
        body, self._tool_text = self._tool_text, ""
        if not body.strip():
            return
        try:
            call = json.loads(body)
        except ValueError:
            call = None  # cut short (max_tokens): the text as it came
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            pieces.append(Content(body))
            return
        self.tool_calls += 1
        pieces.append(ToolCallPiece(call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False)))


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
