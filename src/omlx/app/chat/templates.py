"""Chat templates as omlx uses them: API-neutral chat messages in, prompt text and tokens out.

A conversation's next turn should start with exactly the tokens of its previous turn plus
what the model produced (DESIGN §1: that prefix is what the cache restores). Three things
templates do not do by themselves, and this module does:

- *Messages a strict template refuses.* Claude Code and Codex send system messages after
  the first turn and user text right after tool results; Mistral's, Gemma's and Qwen's
  templates raise on some of these. What a template refuses is probed once per model and
  such messages are reshaped (``template_fit``) inside the run of messages that came with
  them, the same way every turn, so no earlier turn's rendering changes.
- *Reasoning of earlier assistant turns.* A template that renders ``reasoning_content`` gets
  it there; for one that does not, it is put back inline between the model's own think
  markers, as the model wrote it.
- *Tools a template does not render*: omlx's fallback (``tool_calls.fallback``) shows them
  in the system turn, logged once per model.

Templates that rewrite history themselves (e.g. drop earlier reasoning) are detected once
per model with a probe conversation and reported in the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from omlx.app.chat.template_fit import TemplateLimits, fit, probe_limits
from omlx.app.chat.tool_calls import fallback
from omlx.app.errors import InvalidRequest
from omlx.domain.json_values import JsonObject

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A chat rendered through the model's template: the text and its tokens."""

    text: str
    tokens: list[int]


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
        self._limits: TemplateLimits | None = None  # learned once, by probes
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
        prepared = self._prepared(messages, tools, kwargs)
        return self._apply(fit(prepared, self.limits()), kwargs)

    def limits(self) -> TemplateLimits:
        """What this template refuses (probed at first use; the log says what, once)."""
        if self._limits is None:
            self._limits = probe_limits(self._probe)
            if self._limits.strict:
                log.info(
                    "the chat template of %s refuses %s: omlx joins such messages to their "
                    "neighbours in the same turn, the same way every turn (docs/api.md, strict "
                    "chat templates)",
                    self.model_id,
                    "; ".join(self._limits.refused()),
                )
        return self._limits

    def _probe(self, messages: list[JsonObject]) -> str | None:
        # With tools where the template renders them, as agents' requests come.
        tools = fallback.probe_tools() if self.renders_tools() else None
        kwargs: JsonObject = {"add_generation_prompt": True}
        try:
            return self._apply(self._prepared(messages, tools, kwargs), kwargs)
        except InvalidRequest:
            return None

    def _prepared(
        self, messages: list[JsonObject], tools: list[JsonObject] | None, kwargs: JsonObject
    ) -> list[JsonObject]:
        """``messages`` with reasoning and tools where this template shows them (``tools``
        go into ``kwargs`` where the template renders them itself)."""
        messages = [self._inline_reasoning(m) for m in messages]
        if tools and not self.renders_tools():
            return fallback.with_tools_in_system(fallback.inline_calls(messages), tools)
        if tools:
            kwargs["tools"] = tools
            return messages
        if not self.renders_tools():
            return fallback.inline_calls(messages)
        return messages

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
        elif self.renders_tools() and not self._keeps_tools_in_place(ask, answer):
            problem = "moves the tools to the latest user message"
        if problem:
            log.warning(
                "the chat template of %s rewrites history: it %s; a follow-up turn's cached "
                "prefix ends where the rewrite begins",
                self.model_id,
                problem,
            )

    def _keeps_tools_in_place(self, ask: JsonObject, answer: JsonObject) -> bool:
        """Whether a follow-up renders the tools where the previous turn had them (Mistral
        Small 3.1's template shows them before the latest user message instead)."""
        kwargs: JsonObject = {"add_generation_prompt": True, "tools": fallback.probe_tools()}
        again = {"role": "user", "content": "again"}
        try:
            first = self._apply([ask], kwargs)
            second = self._apply([ask, self._inline_reasoning(answer), again], kwargs)
        except InvalidRequest:
            return True  # nothing to report of a template this probe does not suit
        return second.startswith(first)

    def render_raw(self, messages: list[JsonObject]) -> str:
        return self._apply(messages, {"add_generation_prompt": True})
