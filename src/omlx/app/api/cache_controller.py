"""``/v1/cache``: explain what a request would restore, and pin prefixes (issue 24).

A body names its prompt as any chat API does: OpenAI ``messages`` (with ``tools``),
Anthropic ``system`` + ``messages`` (or ``"api": "anthropic"``), or a raw ``prompt``
(a string or token ids). Explaining runs nothing and changes nothing; a pin keeps the
prompt's blocks from eviction, in RAM and on disk, for ``ttl_seconds``.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.params import Parameter

from omlx.app.api.anthropic.schemas import MessagesRequest
from omlx.app.api.anthropic.translate import Translator as AnthropicTranslator
from omlx.app.api.auth import tenant_of
from omlx.app.api.cache_edge import recent_reports
from omlx.app.api.openai.schemas import ChatCompletionRequest, OpenAIErrorResponse
from omlx.app.api.openai.translate import chat_request
from omlx.app.api.openapi import error_responses
from omlx.app.api.translators import translator
from omlx.app.cache_controls.report import report
from omlx.app.cache_controls.transfer import (
    ImportRefused,
    export_archive,
    import_blocks,
    read_archive,
)
from omlx.app.errors import InvalidRequest, NotFound
from omlx.app.models.pool import Served
from omlx.app.wiring.container import Container
from omlx.domain.cache.pins import Pin, PinRefused

_ERRORS = error_responses(OpenAIErrorResponse, 400, 401, 404)
DEFAULT_PIN_TTL = 3600.0


def is_anthropic(body: dict[str, Any]) -> bool:
    """A top-level ``system`` is Anthropic's shape (OpenAI puts it in ``messages``)."""
    return body.get("api") == "anthropic" or "system" in body


def chat_of(body: dict[str, Any], container: Container, served: Served) -> Any:
    """The body's chat request, in the family its shape names; 400 on a malformed one."""
    fields = {k: v for k, v in body.items() if k not in ("api", "ttl_seconds")}
    try:
        if is_anthropic(body):
            fields.setdefault("max_tokens", 1)
            data = msgspec.convert(fields, MessagesRequest)
            return translator(AnthropicTranslator, container, served).chat_request(data, served.id)
        data = msgspec.convert(fields, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(
            f"the request body is not a chat request: {exc}", param="messages"
        ) from exc
    effort = served.chat.renderer.accepts_reasoning_effort
    return chat_request(data, served.id, container.normalizer, effort_kwarg=effort)


async def stored_chat(response_id: str, container: Container, served: Served) -> Any:
    """A stored response's conversation (its input, then its output) as a chat request."""
    from omlx.app.api.responses.controller import history
    from omlx.app.api.responses.schemas import ResponsesRequest
    from omlx.app.api.responses.translate import Translator as ResponsesTranslator

    past = await history(container, response_id)
    data = ResponsesRequest(model=served.id, input=[])
    return translator(ResponsesTranslator, container, served).translate(data, served.id, past).chat


async def prompt_of(
    body: dict[str, Any], container: Container, tenant: str | None
) -> tuple[Served, list[int], Any]:
    """The served model, the prompt's tokens and its cache report (``tenant``'s cache)."""
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidRequest("model is required", param="model")
    served = await container.pool.acquire(model)
    cache = served.prefix_cache
    if cache is None:
        raise InvalidRequest(f"{served.id} has no prefix cache", param="model")
    prompt = body.get("prompt")
    if prompt is not None:
        if isinstance(prompt, str):
            tokens = served.generation.encode_text(prompt, param="prompt")
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            tokens = list(prompt)
        else:
            raise InvalidRequest("prompt must be a string or a list of token ids", param="prompt")
        decode = served.generation.tokenizer.decode
        return served, tokens, report(cache, tokens, lambda t: decode(list(t)), tenant=tenant)
    if isinstance(body.get("response_id"), str):
        chat = await stored_chat(body["response_id"], container, served)
    elif not body.get("messages"):
        raise InvalidRequest("give messages, a prompt or a response_id", param="messages")
    else:
        chat = chat_of(body, container, served)
    chat.cache_tenant = tenant
    tokens, found = await served.chat.explain(chat)
    return served, tokens, found


def pin_json(model: str, pin: Pin, held: int) -> dict[str, Any]:
    """``held_blocks``: how many of its leading blocks the cache holds now (RAM or disk)."""
    return {
        "id": pin.id,
        "model": model,
        "tokens": pin.tokens,
        "blocks": len(pin.keys),
        "held_blocks": held,
        "created_at": pin.created_at,
        "expires_at": pin.expires_at,
        "source": pin.source,
        "group": pin.group,
    }


def pins_of(container: Container) -> list[tuple[Served, Any]]:
    """The loaded models that have a prefix cache, with it."""
    found = []
    for served in container.pool.loaded():
        cache = served.prefix_cache
        if cache is not None:
            found.append((served, cache))
    return found


class CacheController(Controller):
    path = "/v1/cache"
    tags = ("cache",)

    @post(
        "/explain",
        status_code=200,
        operation_id="explainCache",
        summary="What a request would restore, and where it leaves the cache",
        responses=_ERRORS,
    )
    async def explain(
        self, data: dict[str, Any], container: Container, request: Request
    ) -> dict[str, Any]:
        served, _tokens, found = await prompt_of(data, container, tenant_of(request))
        assert found is not None  # prompt_of refuses a model without a cache
        return {"model": served.id, **found.as_json()}

    @post(
        "/pins",
        status_code=201,
        operation_id="createCachePin",
        summary="Pin a prompt's cached prefix for a while",
        responses=_ERRORS,
    )
    async def create_pin(
        self, data: dict[str, Any], container: Container, request: Request
    ) -> dict[str, Any]:
        ttl = data.get("ttl_seconds", DEFAULT_PIN_TTL)
        if not isinstance(ttl, int | float) or isinstance(ttl, bool):
            raise InvalidRequest("ttl_seconds must be a number of seconds", param="ttl_seconds")
        tenant = tenant_of(request)
        served, tokens, _found = await prompt_of(data, container, tenant)
        cache = served.prefix_cache
        assert cache is not None  # prompt_of refuses a model without a cache
        try:
            root = cache.root_of(tenant)
            pin = cache.pins.pin(tokens, float(ttl), "api", root=root, tenant=tenant or "")
        except PinRefused as exc:
            raise InvalidRequest(
                str(exc), param="ttl_seconds" if "ttl" in str(exc) else "messages"
            ) from exc
        return pin_json(served.id, pin, cache.held_blocks(pin.keys))

    @get(
        "/pins",
        operation_id="listCachePins",
        summary="The live pins of every loaded model",
        responses=_ERRORS,
    )
    async def list_pins(self, container: Container, request: Request) -> dict[str, Any]:
        data = []
        for served, cache in pins_of(container):
            for pin in cache.pins.pins(tenant_of(request) or ""):
                data.append(pin_json(served.id, pin, cache.held_blocks(pin.keys)))
        return {"object": "list", "data": data}

    @delete(
        "/pins/{pin_id:str}",
        status_code=200,
        operation_id="deleteCachePin",
        summary="Unpin a prefix",
        responses=_ERRORS,
    )
    async def delete_pin(
        self, pin_id: str, container: Container, request: Request
    ) -> dict[str, Any]:
        return unpin(container, pin_id, tenant_of(request) or "")

    @delete(
        "/pins",
        status_code=200,
        operation_id="deleteCachePinById",
        summary="Unpin a prefix named by ?id=",
        responses=_ERRORS,
    )
    async def delete_pin_by_query(
        self, container: Container, request: Request, pin_id: str = Parameter(query="id")
    ) -> dict[str, Any]:
        return unpin(container, pin_id, tenant_of(request) or "")

    @post(
        "/export",
        status_code=200,
        operation_id="exportCache",
        summary="The cached prefix of a request's prompt as one archive (tar)",
        responses=_ERRORS,
    )
    async def export(
        self, data: dict[str, Any], container: Container, request: Request
    ) -> Response:
        return await export_of(data, container, tenant_of(request))

    @post(
        "/import",
        status_code=200,
        operation_id="importCache",
        summary="Verify an exported archive whole, then queue its blocks for the disk tier",
        responses=_ERRORS,
    )
    async def import_archive(
        self, container: Container, request: Request, model: str = Parameter(query="model")
    ) -> dict[str, Any]:
        archive = await request.body()
        served = await container.pool.acquire(model)
        cache = served.prefix_cache
        if cache is None:
            raise InvalidRequest(f"{served.id} has no prefix cache", param="model")
        tenant = tenant_of(request)
        try:
            blocks = await anyio.to_thread.run_sync(read_archive, archive, cache, tenant)
            queued, present = await anyio.to_thread.run_sync(import_blocks, cache, blocks)
        except ImportRefused as exc:
            raise InvalidRequest(f"import refused: {exc}", param="archive") from exc
        tokens = sum(b.meta.token_count for b in blocks)
        return {
            "model": served.id,
            "blocks": len(blocks),
            "queued": queued,
            "present": present,
            "tokens": tokens,
        }

    @get(
        "/recent",
        operation_id="recentCacheReports",
        summary="The caller's last requests' x-omlx-cache reports, newest first",
        responses=_ERRORS,
    )
    async def recent(self, request: Request) -> dict[str, Any]:
        return {"object": "list", "data": recent_reports(request, tenant_of(request) or "")}

    @get(
        "/stats",
        operation_id="cacheTenantStats",
        summary="The caller's tenant: lookups, prompt and restored tokens, pins, per model",
        responses=_ERRORS,
    )
    async def tenant_stats(self, container: Container, request: Request) -> dict[str, Any]:
        tenant = tenant_of(request) or ""
        models = {
            served.id: {**cache.tenants.read(tenant), "pins": len(cache.pins.pins(tenant))}
            for served, cache in pins_of(container)
        }
        return {"tenant": tenant or None, "models": models}


async def export_of(data: dict[str, Any], container: Container, tenant: str | None) -> Response:
    served, tokens, _found = await prompt_of(data, container, tenant)
    cache = served.prefix_cache
    assert cache is not None  # prompt_of refuses a model without a cache
    try:
        archive, covered = await anyio.to_thread.run_sync(export_archive, cache, tokens, tenant)
    except ImportRefused as exc:
        raise InvalidRequest(str(exc), param="messages") from exc
    headers = {"x-omlx-export-tokens": str(covered), "x-omlx-prompt-tokens": str(len(tokens))}
    return Response(archive, media_type="application/x-tar", headers=headers)


def unpin(container: Container, pin_id: str, tenant: str) -> dict[str, Any]:
    """A tenant unpins only its own pins (another's id is as unknown as a wrong one)."""
    for served, cache in pins_of(container):
        if cache.pins.unpin(pin_id, tenant):
            return {"id": pin_id, "model": served.id, "deleted": True}
    raise NotFound(f"no pin {pin_id!r}", param="id")
