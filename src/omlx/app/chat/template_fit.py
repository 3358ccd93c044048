"""A conversation reshaped for a chat template that refuses some of its messages, prefix-stably.

Strict templates (Mistral Small 3.1, Gemma 2 and 3, Qwen's and Llama's system-first ones)
raise on messages agents send: a system message after the first turn (Claude Code's
environment block and mid-session notes, Codex's), a user message right after a tool result
or another user message, a tool message, or any system message at all. ``TemplateLimits``
says which of these one template refuses (``probe_limits`` learns it once per model, from
fixed probe conversations, so every request is reshaped the same way); ``fit`` rewrites a
conversation into what the template accepts.

Every rewrite stays inside one *run*: the messages between two assistant turns. A client
sends a run whole, in one request (each turn's request is the previous one, the model's
answer, then new messages), so what a turn shares with the next is rewritten the same way in
both and the next turn's prompt starts with the previous one's, generation prompt included:
- a late system message joins the user or tool message right before it; right after an
  assistant turn, it joins the message after it (which came with it), or, with none,
  becomes a user message of its own;
- a user message the template refuses after a user or tool message joins that message;
- tool results become user messages where the template refuses tool messages;
- the leading system messages become one where later ones are refused, and join the first
  user message where a system role is.
Texts are joined by a blank line, the earlier first; images keep their order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from omlx.domain.json_values import JsonObject

SEPARATOR = "\n\n"
_MERGEABLE = ("user", "tool")  # what a run holds besides system messages


@dataclass(frozen=True, slots=True)
class TemplateLimits:
    """What one chat template renders; each False is a kind of message ``fit`` reshapes."""

    system_role: bool = True  # a leading system message
    late_system: bool = True  # system messages after the first user message, where they are
    tool_role: bool = True  # tool results as tool messages
    adjacent_user: bool = True  # a user message right after a user message or a tool result

    @property
    def strict(self) -> bool:
        return not (self.system_role and self.late_system and self.tool_role and self.adjacent_user)

    def refused(self) -> list[str]:
        """The kinds of message this template refuses, in words (for the log)."""
        words = {
            "system_role": "a system message",
            "late_system": "system messages after the first user message",
            "tool_role": "tool messages",
            "adjacent_user": "a user message right after a user message or a tool result",
        }
        return [text for name, text in words.items() if not getattr(self, name)]


def fit(messages: list[JsonObject], limits: TemplateLimits) -> list[JsonObject]:
    """``messages`` as a template with ``limits`` takes them (see the module's docstring)."""
    if not limits.strict:
        return messages
    in_place = limits.late_system and limits.system_role  # no system role: none in place
    lead = 0
    while lead < len(messages) and messages[lead].get("role") == "system":
        lead += 1
    out: list[JsonObject] = [dict(m) for m in messages[:lead]]
    if len(out) > 1 and not in_place:
        out = [{**out[0], "content": _joined_all([m.get("content") for m in out])}]
    waiting: list[Any] = []  # late system texts after an assistant turn, for the next message
    for message in messages[lead:]:
        role = message.get("role")
        previous = out[-1].get("role") if out else None
        if role == "system" and not in_place:
            if not waiting and previous in _MERGEABLE:
                out[-1] = _append(out[-1], message.get("content"))
            else:
                waiting.append(message.get("content"))
            continue
        if role == "tool" and not limits.tool_role:
            message, role = {"role": "user", "content": message.get("content")}, "user"
        if waiting:
            if role in _MERGEABLE:
                message = {**message, "content": _joined_all([*waiting, message.get("content")])}
            else:
                out.append({"role": "user", "content": _joined_all(waiting)})
            waiting = []
        if role == "user" and not limits.adjacent_user and previous in _MERGEABLE:
            out[-1] = _append(out[-1], message.get("content"))
            continue
        out.append(dict(message))
    if waiting:
        out.append({"role": "user", "content": _joined_all(waiting)})
    if not limits.system_role and out and out[0].get("role") == "system":
        system, rest = out[0], out[1:]
        if rest and rest[0].get("role") == "user":
            rest[0] = {**rest[0], "content": _joined(system.get("content"), rest[0].get("content"))}
            return rest
        return [{"role": "user", "content": system.get("content")}, *rest]
    return out


def probe_limits(render: Callable[[list[JsonObject]], str | None]) -> TemplateLimits:
    """What a template renders, from probe conversations: ``render`` gives the prompt text,
    or None where the template refuses the messages. A probe passes when the prompt holds
    every message's text in the conversation's order (a template that drops a message, or
    moves a late system message to the front, refuses it too). Each probe is fitted to what
    the earlier ones found: a template is asked only about what ``fit`` would still send it."""

    def accepts(limits: TemplateLimits, *conversations: list[JsonObject]) -> bool:
        for conversation in conversations:
            text = render(fit(conversation, limits))
            if text is None:
                return False
            at = 0
            for content in (m.get("content") for m in conversation):
                if content:
                    at = text.find(content, at)
                    if at < 0:
                        return False
                    at += len(content)
        return True

    lenient = TemplateLimits()
    rules, ask = _system("omlx probe: rules"), _user("omlx probe: ask")
    call, result = _call(), _tool("omlx probe: result")
    if not accepts(lenient, [_user("omlx probe: a question")]):
        return lenient  # a template that refuses one user message: nothing to learn from it
    limits = TemplateLimits(system_role=accepts(lenient, [rules, ask]))
    limits = replace(limits, tool_role=accepts(limits, [ask, call, result]))
    limits = replace(
        limits,
        adjacent_user=accepts(
            limits,
            [ask, _user("omlx probe: more")],
            [ask, call, result, _user("omlx probe: note")],
        ),
    )
    if not limits.system_role:  # none is rendered in place, then
        return replace(limits, late_system=False)
    answer, again = _assistant("omlx probe: answer"), _user("omlx probe: again")
    return replace(
        limits,
        late_system=accepts(
            limits,
            [rules, _system("omlx probe: more rules"), ask],
            [rules, ask, _system("omlx probe: environment")],
            [rules, ask, answer, _system("omlx probe: note"), again],
            [rules, ask, call, result, _system("omlx probe: tool loaded")],
        ),
    )


def _append(message: JsonObject, content: Any) -> JsonObject:
    return {**message, "content": _joined(message.get("content"), content)}


def _joined_all(contents: list[Any]) -> Any:
    joined: Any = ""
    for content in contents:
        joined = _joined(joined, content)
    return joined


def _joined(first: Any, second: Any) -> Any:
    """Two message contents as one: text by a blank line; parts (images) kept in order."""
    if not _has_text_or_parts(first):
        return second if second is not None else ""
    if not _has_text_or_parts(second):
        return first
    if not isinstance(first, list) and not isinstance(second, list):
        return f"{_text(first)}{SEPARATOR}{_text(second)}"
    if not isinstance(second, list):
        return [*first, {"type": "text", "text": f"{SEPARATOR}{_text(second)}"}]
    if not isinstance(first, list):
        return [{"type": "text", "text": f"{_text(first)}{SEPARATOR}"}, *second]
    return [*first, {"type": "text", "text": SEPARATOR}, *second]


def _has_text_or_parts(content: Any) -> bool:
    return bool(content) if isinstance(content, list | str) else content is not None


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ("" if content is None else str(content))


def _system(text: str) -> JsonObject:
    return {"role": "system", "content": text}


def _user(text: str) -> JsonObject:
    return {"role": "user", "content": text}


def _assistant(text: str) -> JsonObject:
    return {"role": "assistant", "content": text}


def _tool(text: str) -> JsonObject:
    return {"role": "tool", "tool_call_id": "omlxprobe1", "content": text}


def _call() -> JsonObject:
    # Mistral's templates want call ids of at least nine characters.
    function = {"name": "omlx_probe_tool", "arguments": {}}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "omlxprobe1", "type": "function", "function": function}],
    }
