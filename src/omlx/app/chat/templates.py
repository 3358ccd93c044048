"""Chat templates as omlx uses them: API-neutral chat messages in, prompt text and tokens out.

A conversation's next turn should start with exactly the tokens of its previous turn plus
what the model produced (DESIGN §1: that prefix is what the cache restores). Two things
templates do not do by themselves, and this module does:

- *System messages after the first.* Claude Code sends its environment block as a system
  message after the first user turn; templates that accept only a leading system message
  raise on it. Such messages are then folded into the user message before them (or into
  the leading system message): the same fold every turn, so the next turn's prefix holds.
- *Reasoning of earlier assistant turns.* A template that renders ``reasoning_content`` gets
  it there; for one that does not, it is put back inline between the model's own think
  markers, as the model wrote it.

Templates that rewrite history themselves (e.g. drop earlier reasoning) are detected once
per model with a probe conversation and reported in the log. So are templates that render
no ``tools``: those get omlx's fallback (``tool_calls.fallback``), which shows the tools in
the system turn, logged once per model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from omlx.app.chat.tool_calls import fallback
from omlx.app.errors import InvalidRequest
from omlx.domain.json_values import JsonObject

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A chat rendered through the model's template: the text and its tokens."""

    text: str
    tokens: list[int]


def fold_system_messages(messages: list[JsonObject]) -> list[JsonObject]:
    """Leading system messages merged into one; each later one appended to the user turn before it.

    With no user turn before it, a later system message joins the leading system message.
    """
    out: list[JsonObject] = []
    for message in messages:
        if message.get("role") != "system":
            out.append(dict(message))
            continue
        text = _text(message.get("content"))
        target = next((m for m in reversed(out) if m.get("role") == "user"), None)
        if target is None and out and out[0].get("role") == "system":
            target = out[0]
        if target is None:
            out.insert(0, {"role": "system", "content": text})
            continue
        if isinstance(target.get("content"), list):  # a turn with images: parts kept
            target["content"] = [*target["content"], {"type": "text", "text": f"\n\n{text}"}]
            continue
        joined = _text(target.get("content"))
        target["content"] = f"{joined}\n\n{text}" if joined else text
    return out


def _text(content: Any) -> str:
    return content if isinstance(content, str) else ("" if content is None else str(content))


class ChatRenderer:
    """Renders chat messages through one model's template, keeping turns prefix-stable."""

    def __init__(self, tokenizer: Any, model_id: str) -> None:
        self._tokenizer = tokenizer
        self.model_id = model_id
        source = getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):  # several named templates
            source = " ".join(str(v) for v in source.values())
        self.renders_reasoning = "reasoning_content" in str(source or "")
        self.accepts_reasoning_effort = "reasoning_effort" in str(source or "")
        think = (getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None))
        has_thinking = getattr(tokenizer, "has_thinking", False) and all(think)
        self.think: tuple[str, str] | None = think if has_thinking else None  # type: ignore[assignment]
        self._fold_system = False  # learned once: the template rejects a later system message
        self._probed = False
        self._renders_tools: bool | None = None  # learned once, by a probe

    def renders_tools(self) -> bool:
        """Whether the template shows the model its ``tools`` (else the fallback does)."""
        if self._renders_tools is None:
            ask = [{"role": "user", "content": "ping"}]
            kwargs = {"add_generation_prompt": True, "tools": fallback.probe_tools()}
            try:
                text = self._apply(ask, kwargs)
            except InvalidRequest:
                text = ""
            self._renders_tools = fallback.PROBE_TOOL in text
            if not self._renders_tools:
                log.info(
                    "the chat template of %s renders no tools: omlx shows them in the system "
                    "turn and reads calls as <tool_call> JSON (docs/api.md, tool calls)",
                    self.model_id,
                )
        return self._renders_tools

    def render(
        self,
        messages: list[JsonObject],
        tools: list[JsonObject] | None = None,
        template_kwargs: JsonObject | None = None,
    ) -> str:
        """The prompt text, ending with the template's generation prompt."""
        if not self._probed:
            self._probed = True
            self._report_history_rewrites()
        kwargs: JsonObject = {**(template_kwargs or {}), "add_generation_prompt": True}
        messages = [self._inline_reasoning(m) for m in messages]
        if tools and not self.renders_tools():
            messages = fallback.with_tools_in_system(fallback.inline_calls(messages), tools)
        elif tools:
            kwargs["tools"] = tools
        elif not self.renders_tools():
            messages = fallback.inline_calls(messages)
        folded = fold_system_messages(messages) if _has_later_system(messages) else messages
        if self._fold_system and folded is not messages:
            return self._apply(folded, kwargs)
        try:
            return self._apply(messages, kwargs)
        except InvalidRequest:
            if folded is messages:
                raise
        text = self._apply(folded, kwargs)
        self._fold_system = True
        log.info(
            "the chat template of %s accepts only a leading system message: later system "
            "messages are folded into the user turn before them",
            self.model_id,
        )
        return text

    def _apply(self, messages: list[JsonObject], kwargs: JsonObject) -> str:
        try:
            text = self._tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        except Exception as exc:  # jinja raises on messages a template rejects
            raise InvalidRequest(
                f"the model's chat template rejected the messages: {exc}", param="messages"
            ) from exc
        if not isinstance(text, str):
            raise InvalidRequest("the model's chat template did not render text", param="messages")
        return text

    def _inline_reasoning(self, message: JsonObject) -> JsonObject:
        """An assistant turn's reasoning where this template will render it."""
        reasoning = message.get("reasoning_content")
        if message.get("role") != "assistant" or not reasoning or self.renders_reasoning:
            return message
        out = {k: v for k, v in message.items() if k != "reasoning_content"}
        if self.think is not None:
            start, end = self.think
            out["content"] = f"{start}{reasoning}{end}{_text(message.get('content'))}"
        return out

    def _report_history_rewrites(self) -> None:
        """Log once if this template does not continue a turn with the previous prompt and answer."""
        ask = {"role": "user", "content": "ping"}
        answer: JsonObject = {"role": "assistant", "content": "pong"}
        if self.think is not None:
            answer["reasoning_content"] = "hmm"
        try:
            first = self.render_raw([ask])
            second = self.render_raw(
                [ask, self._inline_reasoning(answer), {"role": "user", "content": "again"}]
            )
        except Exception:  # a template that needs more than this probe: nothing to report
            return
        problem = ""
        if not second.startswith(first):
            problem = (
                "re-renders the end of the previous prompt (its generation prompt is not kept)"
            )
        elif "pong" not in second[len(first) :]:
            problem = "does not render the previous answer after the previous prompt"
        elif self.think is not None and "hmm" not in second:
            problem = "drops the reasoning of earlier turns"
        if problem:
            log.warning(
                "the chat template of %s rewrites history: it %s; a follow-up turn's cached "
                "prefix ends where the previous answer begins",
                self.model_id,
                problem,
            )

    def render_raw(self, messages: list[JsonObject]) -> str:
        return self._apply(messages, {"add_generation_prompt": True})


def _has_later_system(messages: list[JsonObject]) -> bool:
    seen_other = False
    for message in messages:
        if message.get("role") != "system":
            seen_other = True
        elif seen_other:
            return True
    # Several leading system messages: some templates accept only one.
    return sum(1 for m in messages if m.get("role") == "system") > 1
