"""Whole (non-streamed) OpenAI answers: a finished chat turn or completion as its JSON object."""

from __future__ import annotations

from collections.abc import Callable

from omlx.app.api.openai.logprobs import chat_logprobs, completion_logprobs
from omlx.app.api.openai.schemas import (
    ChatCompletion,
    Choice,
    CompletionChoice,
    ResponseMessage,
    TextCompletion,
    ToolCall,
    ToolCallFunction,
)
from omlx.app.api.openai.stream import call_id, chat_finish_reason, usage_of
from omlx.app.chat.output import collect
from omlx.app.chat.service import Completion
from omlx.app.chat.turn import ChatResult

TokenText = Callable[[int], tuple[str, bytes]]


def chat_completion(
    rid: str, created: int, model: str, result: ChatResult, token_text: TokenText | None
) -> ChatCompletion:
    """A ``chat.completion``: the answer's text, reasoning and tool calls, and its usage."""
    text, reasoning, calls = collect(result.pieces)
    message = ResponseMessage(
        role="assistant",
        content=text if text or not calls else None,
        refusal=None,
        tool_calls=[
            ToolCall(id=call_id(), function=ToolCallFunction(name=c.name, arguments=c.arguments))
            for c in calls
        ]
        or None,
        reasoning_content=reasoning or None,
    )
    f = result.finished
    logprobs = chat_logprobs(result.logprobs, token_text) if token_text else None
    return ChatCompletion(
        id=rid,
        created=created,
        model=model,
        choices=[Choice(0, message, chat_finish_reason(f.reason, len(calls)), logprobs)],
        usage=usage_of(f.prompt_tokens, f.completion_tokens, f.cached_tokens),
    )


def text_completion(
    rid: str,
    created: int,
    model: str,
    result: Completion,
    prefix: str,
    token_text: TokenText | None,
) -> TextCompletion:
    """A ``text_completion``: ``prefix`` (the echoed prompt) then the generated text."""
    reason = "length" if result.finish_reason == "length" else "stop"
    logprobs = completion_logprobs(result.logprobs, token_text) if token_text else None
    return TextCompletion(
        id=rid,
        created=created,
        model=model,
        choices=[CompletionChoice(0, prefix + result.text, reason, logprobs)],
        usage=usage_of(result.prompt_tokens, result.completion_tokens, result.cached_tokens),
    )
