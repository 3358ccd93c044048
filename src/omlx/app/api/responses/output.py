"""Responses-API output: the model's pieces as output items, with the stream events that
build them, and the Response object around them.

A run of reasoning is one ``reasoning`` item (its text as a ``reasoning_text`` part and,
when asked for, sealed in ``encrypted_content``), a run of text one ``message`` item, each
tool call one ``function_call`` item. Streamed and plain responses are built by the same
``OutputBuilder``; the plain path just drops the events.
"""

from __future__ import annotations

import msgspec

from omlx.app.api.openai.stream import call_id
from omlx.app.api.responses.items import new_id
from omlx.app.api.responses.schemas import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from omlx.app.chat.output import (
    Content,
    Piece,
    Reasoning,
    ToolCallArgs,
    ToolCallPiece,
    ToolCallStart,
)
from omlx.app.chat.sealing import ReasoningSeal
from omlx.domain.json_values import JsonObject

Event = JsonObject  # a stream event without its sequence_number


class OutputBuilder:
    """Feed pieces in order; get the stream events they make, and the output items."""

    def __init__(self, seal: ReasoningSeal, encrypted_reasoning: bool = False) -> None:
        self.seal = seal
        self.encrypted_reasoning = encrypted_reasoning
        self.items: list[JsonObject] = []
        self._open: JsonObject | None = None  # the reasoning or message item being written
        self._texts: list[str] = []
        self._calls: dict[int, JsonObject] = {}  # streaming function_call items, by call index

    @property
    def reasoning_text(self) -> str:
        return "".join(
            p["text"] for i in self.items if i["type"] == "reasoning" for p in i["content"]
        )

    def feed(self, piece: Piece) -> list[Event]:
        if isinstance(piece, ToolCallStart):
            return [*self.close(), self._call_added(piece.index, piece.name)]
        if isinstance(piece, ToolCallArgs):
            item = self._calls[piece.index]
            item["arguments"] += piece.text
            where = self._where(item)
            return [
                {**where, "delta": piece.text, "type": "response.function_call_arguments.delta"}
            ]
        if isinstance(piece, ToolCallPiece):
            if piece.streamed:
                return self._call_done(self._calls.pop(piece.index), piece)
            return [*self.close(), *self._call(piece)]
        assert isinstance(piece, Reasoning | Content)
        kind = "reasoning" if isinstance(piece, Reasoning) else "message"
        events = [] if self._open is not None and self._open["type"] == kind else self._begin(kind)
        self._texts.append(piece.text)
        delta = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        event = {**self._where(), "content_index": 0, "delta": piece.text, "type": delta}
        if kind == "message":
            event["logprobs"] = []
        return [*events, event]

    def close(self, status: str = "completed") -> list[Event]:
        """End the open item (``incomplete`` when the output was cut short)."""
        item = self._open
        if item is None:
            return []
        text, where = "".join(self._texts), self._where()
        self._open, self._texts = None, []
        done = {**where, "content_index": 0, "text": text}
        if item["type"] == "reasoning":
            part: JsonObject = {"type": "reasoning_text", "text": text}
            done["type"] = "response.reasoning_text.done"
            if self.encrypted_reasoning:
                item["encrypted_content"] = self.seal.seal(text)
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            done.update(logprobs=[], type="response.output_text.done")
        item.update(content=[part], status=status)
        return [
            done,
            {**where, "content_index": 0, "part": part, "type": "response.content_part.done"},
            self._item_event("response.output_item.done", item),
        ]

    def finish(self, status: str = "completed") -> list[Event]:
        """Close what is open; an answer with no output at all is one empty message.

        The empty message matters: sent back, it renders the turn the model ended at once.
        """
        events = self.close(status)
        if not self.items:
            events += self._begin("message")
            events += self.close(status)
        return events

    def _begin(self, kind: str) -> list[Event]:
        events = self.close()
        if kind == "reasoning":
            item: JsonObject = {"id": new_id("rs"), "type": "reasoning", "summary": []}
            part: JsonObject = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant"}
            part = {"type": "output_text", "text": "", "annotations": []}
        item.update(content=[], status="in_progress")
        self.items.append(item)
        self._open = item
        events.append(self._item_event("response.output_item.added", item))
        events.append(
            {
                **self._where(),
                "content_index": 0,
                "part": part,
                "type": "response.content_part.added",
            }
        )
        return events

    def _call_added(self, index: int, name: str) -> Event:
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "call_id": call_id(),
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        self.items.append(item)
        self._calls[index] = item
        return self._item_event("response.output_item.added", item)

    def _call(self, piece: ToolCallPiece) -> list[Event]:
        added = self._call_added(piece.index, piece.name)
        item = self._calls.pop(piece.index)
        item["arguments"] = piece.arguments
        delta = {
            **self._where(item),
            "delta": piece.arguments,
            "type": "response.function_call_arguments.delta",
        }
        return [added, delta, *self._call_done(item, piece)]

    def _call_done(self, item: JsonObject, piece: ToolCallPiece) -> list[Event]:
        """A call's arguments are whole (``incomplete``: cut by max_output_tokens)."""
        item.update(
            arguments=piece.arguments, status="completed" if piece.complete else "incomplete"
        )
        return [
            {
                **self._where(item),
                "name": piece.name,
                "arguments": piece.arguments,
                "type": "response.function_call_arguments.done",
            },
            self._item_event("response.output_item.done", item),
        ]

    def _index(self, item: JsonObject) -> int:
        return next(i for i in range(len(self.items) - 1, -1, -1) if self.items[i] is item)

    def _where(self, item: JsonObject | None = None) -> Event:
        item = item or self._open
        assert item is not None
        return {"item_id": item["id"], "output_index": self._index(item)}

    def _item_event(self, kind: str, item: JsonObject) -> Event:
        # A copy: the item changes after it is added, the event must not.
        return {"output_index": self._index(item), "item": dict(item), "type": kind}


def base_response(rid: str, created: int, data: ResponsesRequest) -> ResponseObject:
    """The response as it starts (``in_progress``, no output), echoing the request."""
    reasoning = None
    if data.reasoning is not None:
        reasoning = {"effort": data.reasoning.effort, "summary": data.reasoning.summary}
    text: JsonObject = {"format": {"type": "text"}}
    if data.text is not None and data.text.format is not None:
        # omit_defaults drops a "text" type: it is written back first
        text["format"] = {"type": data.text.format.type, **msgspec.to_builtins(data.text.format)}
    if data.text is not None and data.text.verbosity is not None:
        text["verbosity"] = data.text.verbosity
    return ResponseObject(
        id=rid,
        created_at=created,
        status="in_progress",
        instructions=data.instructions,
        max_output_tokens=data.max_output_tokens,
        model=data.model,
        output=[],
        parallel_tool_calls=data.parallel_tool_calls is not False,
        previous_response_id=data.previous_response_id,
        reasoning=reasoning,
        store=data.store,
        temperature=data.temperature,
        text=text,
        tool_choice=data.tool_choice if data.tool_choice is not None else "auto",
        tools=list(data.tools or []),
        top_p=data.top_p,
        metadata=data.metadata,
        prompt_cache_key=data.prompt_cache_key,
        safety_identifier=data.safety_identifier,
        service_tier="default",
        user=data.user,
    )


def usage_of(
    prompt: int, completion: int, cached: int, reasoning: int, caching: bool
) -> ResponseUsage:
    """``input_tokens`` counts the whole prompt, cached tokens included (OpenAI's way)."""
    return ResponseUsage(
        input_tokens=prompt,
        input_tokens_details=InputTokensDetails(
            cached_tokens=cached, cache_write_tokens=prompt - cached if caching else 0
        ),
        output_tokens=completion,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=min(reasoning, completion)),
        total_tokens=prompt + completion,
    )


def finished_response(
    base: ResponseObject,
    items: list[JsonObject],
    usage: ResponseUsage | None,
    *,
    cut: bool = False,
    error: str | None = None,
    now: int,
) -> ResponseObject:
    """The final response: ``completed``, ``incomplete`` (cut by max_output_tokens) or ``failed``."""
    if error is not None:
        return msgspec.structs.replace(
            base,
            status="failed",
            output=items,
            usage=usage,
            error=ResponseError(code="server_error", message=error),
        )
    return msgspec.structs.replace(
        base,
        status="incomplete" if cut else "completed",
        completed_at=None if cut else now,
        output=items,
        usage=usage,
        incomplete_details=IncompleteDetails("max_output_tokens") if cut else None,
    )
