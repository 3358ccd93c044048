"""``/v1/cache``: explain what a request would restore, pin prefixes, export and import (issue 24).

A body names its prompt as any chat API does: OpenAI ``messages`` (with ``tools``),
Anthropic ``system`` + ``messages`` (or ``"api": "anthropic"``), a stored response
(``response_id``) or a raw ``prompt`` (a string or token ids). Explaining runs nothing and
changes nothing; a pin keeps the prompt's blocks from eviction, in RAM and on disk, for
``ttl_seconds``. Each route calls the served model's ``CacheControls``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

import anyio
import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.params import Parameter
from litestar.response import Stream

from omlx.app.api.anthropic.schemas import MessagesRequest
from omlx.app.api.auth import is_operator, tenant_of
from omlx.app.api.browser_guard import BODY_TYPES
from omlx.app.api.cache_edge import recent_reports
from omlx.app.api.openai.schemas import ChatCompletionRequest, OpenAIErrorResponse
from omlx.app.api.openapi import error_responses
from omlx.app.api.responses.controller import history
from omlx.app.api.responses.schemas import ResponsesRequest
from omlx.app.api.translators import Translators
from omlx.app.api.uploads import refuse_if_announced_over, spool_body
from omlx.app.cache_controls.report import CacheReport
from omlx.app.cache_controls.service import (
    CacheControls,
    ImportRefused,
    ImportTooLarge,
    NoPrefixCache,
    PinRefused,
    PinView,
    TenantUsage,
)
from omlx.app.cache_controls.session_key import choose_session_key
from omlx.app.chat.pipeline import ChatRequest
from omlx.app.errors import InvalidRequest, NotFound, TooLarge
from omlx.app.models.pool import ModelPool, Served
from omlx.app.settings import Settings
from omlx.domain.json_values import JsonObject
from omlx.domain.responses import ResponseStore

_ERRORS = error_responses(OpenAIErrorResponse, 400, 401, 404)
DEFAULT_PIN_TTL = 3600.0


class CachePrompt(msgspec.Struct, kw_only=True):
    """A prompt named the way a chat request names it (see the module docstring).

    The chat shapes' other fields (``tools``, ``chat_template_kwargs``, ...) are read from
    the same body by that API's own request type, so the prompt renders as a chat would.
    """

    model: str
    api: Literal["openai", "anthropic"] | None = None
    prompt: str | list[int] | None = None
    response_id: str | None = None
    messages: list[Any] | None = None
    system: Any = None
    # The session it names, reported as a chat request's would be (``session_key``).
    prompt_cache_key: str | None = None
    metadata: Any = None

    @property
    def anthropic(self) -> bool:
        """A top-level ``system`` is Anthropic's shape (OpenAI puts it in ``messages``)."""
        return self.api == "anthropic" or self.system is not None


class PinRequest(CachePrompt, kw_only=True):
    ttl_seconds: float = DEFAULT_PIN_TTL


class PinJSON(msgspec.Struct):
    """A pin; ``held_blocks``: how many of its leading blocks RAM or disk holds now."""

    id: str
    model: str
    tokens: int
    blocks: int
    held_blocks: int
    created_at: float
    expires_at: float
    source: str
    group: str | None


class PinList(msgspec.Struct):
    data: list[PinJSON]
    object: str = "list"


class Unpinned(msgspec.Struct):
    id: str
    model: str
    deleted: bool = True


class ImportedJSON(msgspec.Struct):
    """An import's honest count: every block of the archive was verified; ``written`` are on
    disk and in the index now, ``present`` were already, ``refused`` were not written
    (per reason: ``no_space``, ``queue_full``, ...)."""

    model: str
    blocks: int
    written: int
    present: int
    refused: dict[str, int]
    tokens: int


def pin_json(model: str, view: PinView) -> PinJSON:
    pin = view.pin
    return PinJSON(
        pin.id,
        model,
        pin.tokens,
        len(pin.keys),
        view.held_blocks,
        pin.created_at,
        pin.expires_at,
        pin.source,
        pin.group,
    )


async def chat_of(
    body: CachePrompt, raw: bytes, served: Served, translate: Translators, responses: ResponseStore
) -> ChatRequest:
    """The body's chat request, in the family its shape names, its images read; 400 on a
    malformed one."""
    return await translate.read_images(await _translated(body, raw, served, translate, responses))


async def _translated(
    body: CachePrompt, raw: bytes, served: Served, translate: Translators, responses: ResponseStore
) -> ChatRequest:
    assert served.chat is not None  # the pool hands these routes chat models
    if body.response_id is not None:  # a stored response's conversation: input, then output
        past = await history(responses, body.response_id)
        data = ResponsesRequest(model=served.id, input=[])
        return translate.responses(served.chat).translate(data, served.id, past).chat
    if not body.messages:
        raise InvalidRequest("give messages, a prompt or a response_id", param="messages")
    try:
        if body.anthropic:
            fields = msgspec.json.decode(raw)
            fields.setdefault("max_tokens", 1)
            message = msgspec.convert(fields, MessagesRequest)
            return translate.anthropic(served.chat).chat_request(message, served.id)
        request = msgspec.json.decode(raw, type=ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        message = f"the request body is not a chat request: {exc}"
        raise InvalidRequest(message, param="messages") from exc
    return translate.openai(request, served.id, served.chat)


async def prompt_of(
    body: CachePrompt,
    request: Request,
    pool: ModelPool,
    translate: Translators,
    responses: ResponseStore,
) -> tuple[Served, CacheControls, list[int], CacheReport]:
    """The served model, its controls, the prompt's tokens and its report (the tenant's cache)."""
    served = await pool.acquire(body.model)
    controls, tenant = served.controls, tenant_of(request)
    session = choose_session_key(
        request.headers, prompt_cache_key=body.prompt_cache_key, metadata=body.metadata
    )
    if controls is None or not controls.enabled:
        raise InvalidRequest(f"{served.id} has no prefix cache", param="model")
    if body.prompt is not None:
        if isinstance(body.prompt, str):
            encode = served.generation.encode_text
            tokens = await anyio.to_thread.run_sync(encode, body.prompt, "prompt")
        elif body.prompt:
            tokens = list(body.prompt)
            served.generation.check_token_ids(tokens)
        else:
            raise InvalidRequest("prompt must be a string or a list of token ids", param="prompt")
        report = await anyio.to_thread.run_sync(controls.explain, tokens, tenant, session)
        return served, controls, tokens, report
    chat = await chat_of(body, await request.body(), served, translate, responses)
    tokens, report = await served.chat.explain(chat, tenant, session)
    assert report is not None  # a model with a prefix cache always reports
    return served, controls, tokens, report


def _loaded(pool: ModelPool) -> list[tuple[str, CacheControls]]:
    """The loaded models that have a prefix cache, with their controls."""
    return [(s.id, s.controls) for s in pool.loaded() if s.controls and s.controls.enabled]


def unpin(pool: ModelPool, pin_id: str, tenant: str | None) -> Unpinned:
    """A tenant unpins only its own pins (another's id is as unknown as a wrong one)."""
    for model, controls in _loaded(pool):
        if controls.unpin(pin_id, tenant):
            return Unpinned(pin_id, model)
    raise NotFound(f"no pin {pin_id!r}", param="id")


def pins_of(pool: ModelPool, tenant: str | None) -> dict[str, list[PinView]]:
    """Each loaded model's live pins of ``tenant``, soonest to expire first."""
    return {model: controls.pins(tenant) for model, controls in _loaded(pool)}


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
        self,
        data: CachePrompt,
        request: Request,
        pool: ModelPool,
        translate: Translators,
        responses: ResponseStore,
    ) -> JsonObject:
        served, _, _, report = await prompt_of(data, request, pool, translate, responses)
        return {"model": served.id, **report.as_json()}

    @post(
        "/pins",
        status_code=201,
        operation_id="createCachePin",
        summary="Pin a prompt's cached prefix for a while",
        responses=_ERRORS,
    )
    async def create_pin(
        self,
        data: PinRequest,
        request: Request,
        pool: ModelPool,
        translate: Translators,
        responses: ResponseStore,
    ) -> PinJSON:
        served, controls, tokens, _ = await prompt_of(data, request, pool, translate, responses)
        try:
            view = controls.pin(tokens, data.ttl_seconds, tenant=tenant_of(request))
        except PinRefused as exc:
            param = "ttl_seconds" if "ttl" in str(exc) else "messages"
            raise InvalidRequest(str(exc), param=param) from exc
        return pin_json(served.id, view)

    @get(
        "/pins",
        operation_id="listCachePins",
        summary="The live pins of every loaded model",
        responses=_ERRORS,
    )
    async def list_pins(self, pool: ModelPool, request: Request) -> PinList:
        pins = pins_of(pool, tenant_of(request))
        return PinList([pin_json(model, view) for model, views in pins.items() for view in views])

    @delete(
        "/pins/{pin_id:str}",
        status_code=200,
        operation_id="deleteCachePin",
        summary="Unpin a prefix",
        responses=_ERRORS,
    )
    async def delete_pin(self, pin_id: str, pool: ModelPool, request: Request) -> Unpinned:
        return unpin(pool, pin_id, tenant_of(request))

    @delete(
        "/pins",
        status_code=200,
        operation_id="deleteCachePinById",
        summary="Unpin a prefix named by ?id=",
        responses=_ERRORS,
    )
    async def delete_pin_by_query(
        self, pool: ModelPool, request: Request, pin_id: str = Parameter(query="id")
    ) -> Unpinned:
        return unpin(pool, pin_id, tenant_of(request))

    @post(
        "/export",
        status_code=200,
        operation_id="exportCache",
        summary="The cached prefix of a request's prompt as one archive (tar)",
        responses=_ERRORS,
    )
    async def export(
        self,
        data: CachePrompt,
        request: Request,
        pool: ModelPool,
        translate: Translators,
        responses: ResponseStore,
    ) -> Stream:
        _, controls, tokens, _ = await prompt_of(data, request, pool, translate, responses)
        try:
            made = await anyio.to_thread.run_sync(controls.export, tokens, tenant_of(request))
        except ImportRefused as exc:
            raise InvalidRequest(str(exc), param="messages") from exc
        headers = {
            "x-omlx-export-tokens": str(made.tokens),
            "x-omlx-prompt-tokens": str(len(tokens)),
        }
        # Read and sent file by file (each ``next`` runs in a worker thread).
        return Stream(made.chunks, media_type="application/x-tar", headers=headers)

    @post(
        "/import",
        status_code=200,
        operation_id="importCache",
        summary="Verify an exported archive whole, then write its blocks to the disk tier",
        responses=error_responses(OpenAIErrorResponse, 400, 401, 404, 413),
        request_max_body_size=None,  # bounded by max_import_bytes instead (api.uploads)
        # An archive, not JSON: still a type no cross-site form or no-cors fetch can send.
        opt={BODY_TYPES: ("application/x-tar", "application/octet-stream")},
    )
    async def import_archive(
        self,
        request: Request,
        pool: ModelPool,
        settings: Settings,
        model: str = Parameter(query="model"),
    ) -> ImportedJSON:
        limit = settings.max_import_bytes
        refuse_if_announced_over(request, limit, "max_import_bytes")  # before a model loads
        served = await pool.acquire(model)
        if served.controls is None or not served.controls.enabled:
            raise InvalidRequest(f"{served.id} has no prefix cache", param="model")
        archive = await spool_body(request, limit, "max_import_bytes")
        try:
            done = await anyio.to_thread.run_sync(
                served.controls.import_, archive, tenant_of(request), settings.max_import_blocks
            )
        except ImportTooLarge as exc:
            raise TooLarge(str(exc), param="max_import_blocks") from exc
        except (ImportRefused, NoPrefixCache) as exc:
            raise InvalidRequest(f"import refused: {exc}", param="archive") from exc
        finally:
            archive.close()
        return ImportedJSON(
            served.id, done.blocks, done.written, done.present, done.refused, done.tokens
        )

    @get(
        "/recent",
        operation_id="recentCacheReports",
        summary="The caller's last requests' x-omlx-cache reports, newest first",
        responses=_ERRORS,
    )
    async def recent(self, request: Request) -> JsonObject:
        return {"object": "list", "data": recent_reports(request, tenant_of(request) or "")}

    @get(
        "/stats",
        operation_id="cacheTenantStats",
        summary="The caller's tenant: lookups, prompt and restored tokens, pins, per model "
        "(an operator's key adds every tenant's, under 'tenants')",
        responses=_ERRORS,
    )
    async def tenant_stats(self, pool: ModelPool, request: Request) -> JsonObject:
        tenant = tenant_of(request)
        out: JsonObject = {"tenant": tenant or None, "models": _usage(pool, tenant)}
        if is_operator(request):
            names = sorted({t for _, controls in _loaded(pool) for t in controls.tenants()})
            out["tenants"] = {name or "": _usage(pool, name or None) for name in names}
        return out


def usage_of(pool: ModelPool, tenant: str | None) -> dict[str, TenantUsage]:
    """Per loaded model with a cache: ``tenant``'s lookups, prompt and restored tokens, pins."""
    out = {}
    for model, controls in _loaded(pool):
        usage = controls.usage(tenant)
        if usage is not None:
            out[model] = usage
    return out


def _usage(pool: ModelPool, tenant: str | None) -> dict[str, dict[str, int]]:
    return {model: asdict(usage) for model, usage in usage_of(pool, tenant).items()}
