"""One Responses-API turn, streamed or not: the output it builds, its final Response, storage.

``ResponseRun`` ends a turn the same way on both paths (status, usage, storing it when
``store`` is on, before the client hears it is done, so a follow-up naming it finds it).
``ResponseRun.stream`` is the SSE body: ``response.created``, ``response.in_progress``, the
items' events, then ``response.completed`` / ``response.incomplete``; after a failure, an
``error`` event and ``response.failed``. Every event carries its ``sequence_number``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import msgspec
from litestar.response.sse import ServerSentEventMessage

from omlx.app.api.responses.output import Event, OutputBuilder, finished_response, usage_of
from omlx.app.api.responses.schemas import ResponseObject, ResponseUsage
from omlx.app.api.sse import KEEPALIVE
from omlx.app.chat.pipeline import ChatEvent, Done, Error, Output, Started
from omlx.app.errors import AppError
from omlx.domain.generation import Finished
from omlx.domain.json_values import JsonObject
from omlx.domain.responses import ResponseStore, StoredResponse

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ResponseRun:
    base: ResponseObject
    builder: OutputBuilder
    items: list[JsonObject]  # this turn's own input items, stored with the response
    previous_id: str | None  # the response it continues: its items are stored there
    store: ResponseStore | None  # None: store is off
    caching: bool  # the prefix cache keeps what is prefilled (usage.cache_write_tokens)
    count_tokens: Callable[[str], int]  # tokens of a text (reasoning_tokens in usage)

    # --- ending a turn --------------------------------------------------------------

    def complete(self, finished: Finished) -> tuple[list[Event], ResponseObject]:
        """The events that close the output, and the final response."""
        cut = finished.reason == "length"
        events = self.builder.finish("incomplete" if cut else "completed")
        final = finished_response(
            self.base, self.builder.items, self._usage(finished), cut=cut, now=int(time.time())
        )
        return events, final

    def fail(self, message: str, started: Started | None) -> tuple[list[Event], ResponseObject]:
        events = self.builder.close("incomplete")
        usage = None
        if started is not None:
            usage = usage_of(started.prompt_tokens, 0, started.cached_tokens, 0, self.caching)
        final = finished_response(
            self.base, self.builder.items, usage, error=message, now=int(time.time())
        )
        return events, final

    def _usage(self, f: Finished) -> ResponseUsage:
        reasoning = self.builder.reasoning_text
        try:
            reasoning_tokens = self.count_tokens(reasoning) if reasoning else 0
        except Exception:  # a count for usage only: never fail the turn over it
            reasoning_tokens = 0
        return usage_of(
            f.prompt_tokens, f.completion_tokens, f.cached_tokens, reasoning_tokens, self.caching
        )

    async def keep(self, response: ResponseObject) -> ResponseObject:
        """Store the response (``store: true``) and return it. When it cannot be stored (the
        database down, full or read-only, over the byte budget), the response says so with
        ``store: false`` (its id will not be found) and one warning line names the cause."""
        if self.store is None:
            return response
        record = StoredResponse(
            id=response.id,
            created_at=float(response.created_at),
            response=msgspec.to_builtins(response),
            input_items=self.items,
            previous_id=self.previous_id,
        )
        try:
            await anyio.to_thread.run_sync(self.store.put, record)
        except Exception as exc:  # IndexUnavailable, TooLargeToStore, or a database error
            log.warning("response %s not stored: %s", response.id, _first_line(exc))
            return msgspec.structs.replace(response, store=False)
        return response

    # --- the SSE body ----------------------------------------------------------------

    async def stream(
        self, events: AsyncGenerator[ChatEvent | None, None]
    ) -> AsyncIterator[ServerSentEventMessage]:
        """The SSE events; closing it (the client left) closes ``events``, cancelling the turn."""
        try:
            async for message in self._stream(events):
                yield message
        finally:
            await events.aclose()

    async def _stream(
        self, events: AsyncIterator[ChatEvent | None]
    ) -> AsyncIterator[ServerSentEventMessage]:
        numbered = _Numbered()
        snapshot = msgspec.to_builtins(self.base)
        yield numbered.event({"type": "response.created", "response": snapshot})
        yield numbered.event({"type": "response.in_progress", "response": snapshot})
        started: Started | None = None
        failure: str | None = None
        code = "server_error"  # the error event's; the failed response's is always this one
        try:
            async for event in events:
                if event is None:
                    yield KEEPALIVE
                elif isinstance(event, Started):
                    started = event
                elif isinstance(event, Output | Done):
                    for piece in event.pieces:
                        for e in self.builder.feed(piece):
                            yield numbered.event(e)
                    if isinstance(event, Done):
                        closing, final = self.complete(event.finished)
                        for e in closing:
                            yield numbered.event(e)
                        final = await self.keep(final)
                        kind = f"response.{'incomplete' if final.status == 'incomplete' else 'completed'}"
                        yield numbered.event({"type": kind, "response": msgspec.to_builtins(final)})
                        return
                elif isinstance(event, Error):
                    failure = event.message
                    break
        except AppError as exc:  # a refusal after the start (the server stopping): no traceback
            failure, code = exc.message, exc.code or code
        except Exception as exc:  # after the 200 went out, an error is the stream's last event
            log.exception("response stream failed")
            failure = f"internal error: {exc}"
        if failure is None:
            failure = "generation ended without a result"
        closing, final = self.fail(failure, started)
        for e in closing:
            yield numbered.event(e)
        yield numbered.event({"type": "error", "code": code, "message": failure, "param": None})
        final = await self.keep(final)
        yield numbered.event({"type": "response.failed", "response": msgspec.to_builtins(final)})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _Numbered:
    """Gives each event of one response the next ``sequence_number`` (0, 1, 2...)."""

    def __init__(self) -> None:
        self.next = 0

    def event(self, body: Event) -> ServerSentEventMessage:
        body = {"type": body["type"], **body, "sequence_number": self.next}
        self.next += 1
        return ServerSentEventMessage(event=body["type"], data=msgspec.json.encode(body).decode())
