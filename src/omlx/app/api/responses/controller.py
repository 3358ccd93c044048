"""OpenAI Responses API routes: create (JSON, or SSE events with stream: true), retrieve,
delete, and a stored response's input items."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import anyio
import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.params import Parameter

from omlx.app.api.cache_edge import note, turn_controls
from omlx.app.api.disconnect import unless_disconnected
from omlx.app.api.openai.schemas import OpenAIErrorResponse
from omlx.app.api.openapi import error_responses, streaming_operation
from omlx.app.api.responses.items import new_id
from omlx.app.api.responses.output import OutputBuilder, base_response
from omlx.app.api.responses.schemas import (
    DeletedResponse,
    InputItemList,
    ResponseObject,
    ResponsesRequest,
)
from omlx.app.api.responses.stream import ResponseRun
from omlx.app.api.responses.translate import Translated
from omlx.app.api.sse import KEEPALIVE_SECONDS, EventStream, opened
from omlx.app.api.translators import Translators
from omlx.app.cache_controls.hints import openai_retention
from omlx.app.chat.turn import ChatResult
from omlx.app.errors import InvalidRequest, NotFound, StoreUnavailable
from omlx.app.models.pool import ModelPool, Served
from omlx.domain.cache.ports import IndexUnavailable
from omlx.domain.json_values import JsonObject
from omlx.domain.responses import (
    BrokenChain,
    ResponseStore,
    StoredResponse,
    conversation_input,
)
from omlx.domain.responses import history as conversation_history

_ERRORS = error_responses(OpenAIErrorResponse, 400, 401, 404, 413, 429, 500)
_READ_ERRORS = error_responses(OpenAIErrorResponse, 400, 401, 404)


async def _from_store(call: Callable[..., Any], *args: Any) -> Any:
    """A store call off the event loop; a database that cannot be used is a 503 naming it."""
    try:
        return await anyio.to_thread.run_sync(call, *args)
    except IndexUnavailable as exc:
        raise StoreUnavailable(
            f"stored responses are unavailable: {exc}; retry once it is back",
            code="store_unavailable",
        ) from exc


async def stored_chain(responses: ResponseStore, response_id: str) -> list[StoredResponse]:
    try:
        chain = await _from_store(responses.chain, response_id)
    except BrokenChain as exc:
        raise NotFound(
            f"stored response {response_id!r} lost an earlier turn: {exc}", param="response_id"
        ) from exc
    if chain is None:
        raise NotFound(f"no stored response {response_id!r}", param="response_id")
    return chain


async def history(responses: ResponseStore, previous_id: str | None) -> list[JsonObject]:
    """The conversation a previous response continued: its input items, then its output."""
    if previous_id is None:
        return []
    try:
        chain = await _from_store(responses.chain, previous_id)
    except BrokenChain:
        chain = None
    if chain is None:
        raise InvalidRequest(
            f"previous_response_id {previous_id!r} names no stored response (stored with "
            "store: false, deleted, or pruned by the retention limits)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return conversation_history(chain)


def check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's limits: 16 pairs, keys of at most 64 characters, values of at most 512."""
    if not metadata:
        return
    if len(metadata) > 16:
        raise InvalidRequest(f"metadata has {len(metadata)} pairs; at most 16", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64:
            raise InvalidRequest(
                f"metadata key {key[:20]!r}... has {len(key)} characters; at most 64",
                param="metadata",
            )
        if len(value) > 512:
            raise InvalidRequest(
                f"metadata[{key!r}] has {len(value)} characters; at most 512", param="metadata"
            )


def _run(
    rid: str,
    data: ResponsesRequest,
    translated: Translated,
    past: int,
    responses: ResponseStore,
    served: Served,
    translate: Translators,
) -> ResponseRun:
    """A response's run: its output built as events, then kept if ``store``."""
    service = served.generation
    return ResponseRun(
        base=base_response(rid, int(time.time()), data),
        builder=OutputBuilder(translate.seal, translated.encrypted_reasoning),
        items=translated.items[past:],  # this turn's own: earlier ones are links
        previous_id=data.previous_response_id,
        store=responses if data.store else None,
        caching=served.prefix_cache is not None,
        count_tokens=lambda text: len(service.encode_text(text)),
    )


async def _whole(run: ResponseRun, result: ChatResult) -> ResponseObject:
    """A finished turn as one response object, kept when the request asked."""
    for piece in result.pieces:
        run.builder.feed(piece)
    _, final = run.complete(result.finished)
    return await run.keep(final)


class ResponsesController(Controller):
    path = "/v1/responses"
    tags = ("openai",)

    @post(
        status_code=200,
        operation_id="createResponse",
        summary="Create a model response (JSON, or SSE events with stream: true)",
        responses=_ERRORS,
        operation_class=streaming_operation(
            "SSE events named by their type: response.created, response.in_progress, the "
            "output items' events, then response.completed (or response.incomplete / "
            "response.failed)"
        ),
    )
    async def create_response(
        self,
        data: ResponsesRequest,
        pool: ModelPool,
        translate: Translators,
        responses: ResponseStore,
        request: Request,
    ) -> ResponseObject:
        check_metadata(data.metadata)
        served = await pool.acquire(data.model)
        past = await history(responses, data.previous_response_id)
        translated = translate.responses(served.chat).translate(data, served.id, past)
        await translate.read_images(translated.chat)
        retention = openai_retention(data.prompt_cache_retention)
        controls = turn_controls(
            request, data.omlx_cache_control, retention=retention, session_key=data.prompt_cache_key
        )
        rid = new_id("resp")
        turn = await served.chat.start(translated.chat, rid, controls, data.previous_response_id)
        turn.on_report = note(request, served.controls, served.id)
        run = _run(rid, data, translated, len(past), responses, served, translate)
        if data.stream:
            events = await opened(served.chat.stream(turn, KEEPALIVE_SECONDS), request.receive)
            return EventStream(run.stream(events))  # type: ignore[return-value]
        return await _whole(
            run, await unless_disconnected(request.receive, served.chat.complete(turn))
        )

    @get(
        "/{response_id:str}",
        operation_id="getResponse",
        summary="A stored response",
        responses=_READ_ERRORS,
    )
    async def get_response(
        self, response_id: str, responses: ResponseStore, stream: bool = False
    ) -> ResponseObject:
        if stream:
            raise InvalidRequest(
                "stream is not supported here: a stored response is returned whole",
                param="stream",
            )
        record = await _from_store(responses.get, response_id)
        if record is None:
            raise NotFound(f"no stored response {response_id!r}", param="response_id")
        return msgspec.convert(record.response, ResponseObject)

    @delete(
        "/{response_id:str}",
        status_code=200,
        operation_id="deleteResponse",
        summary="Delete a stored response",
        responses=_READ_ERRORS,
    )
    async def delete_response(self, response_id: str, responses: ResponseStore) -> DeletedResponse:
        if not await _from_store(responses.delete, response_id):
            raise NotFound(f"no stored response {response_id!r}", param="response_id")
        return DeletedResponse(response_id)

    @get(
        "/{response_id:str}/input_items",
        operation_id="listResponseInputItems",
        summary="The input items of a stored response (its whole conversation)",
        responses=_READ_ERRORS,
    )
    async def list_input_items(
        self,
        response_id: str,
        responses: ResponseStore,
        limit: int = Parameter(default=20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
        include: list[str] | None = None,  # accepted: stored items are returned whole
    ) -> InputItemList:
        items = conversation_input(await stored_chain(responses, response_id))
        if order == "desc":
            items = items[::-1]
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise InvalidRequest(f"after: no input item {after!r} in this list", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return InputItemList(
            data=page,
            first_id=page[0]["id"] if page else None,
            last_id=page[-1]["id"] if page else None,
            has_more=len(items) > limit,
        )
