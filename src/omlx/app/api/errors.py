"""Errors in each API's own envelope (STYLE §7): never a 500 page for a client's mistake."""

from __future__ import annotations

import logging

from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from omlx.app.errors import (
    AppError,
    Busy,
    ClientGone,
    Forbidden,
    GenerationFailed,
    InvalidRequest,
    ModelUnavailable,
    NotFound,
    ServerStopping,
    StoreUnavailable,
    TooLarge,
    Unauthorized,
)

log = logging.getLogger(__name__)

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


# Each app error's HTTP status (subclasses resolve through their bases).
_STATUS: dict[type[AppError], int] = {
    InvalidRequest: 400,
    TooLarge: 413,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Busy: 429,
    ClientGone: 499,
    GenerationFailed: 500,
    ModelUnavailable: 503,
    ServerStopping: 503,
    StoreUnavailable: 503,
}


def status_of(exc: AppError) -> int:
    for kind in type(exc).__mro__:
        if kind in _STATUS:
            return _STATUS[kind]
    return 500


def headers_of(exc: AppError) -> dict[str, str]:
    if isinstance(exc, Busy):
        return {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, Unauthorized):
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, ServerStopping):  # the connection is not kept for another request
        return {"Connection": "close"}
    return {}


def is_anthropic_path(path: str) -> bool:
    """The Anthropic API's routes, and the wrong spellings of them a base URL produces
    (``/v1/v1/messages``, ``/messages``): their clients read only Anthropic's envelope."""
    return (meant_path(path) or path).startswith("/v1/messages")


# The first segment of every /v1 route: what a path with one /v1 too many or too few meant.
_V1_ROUTES = ("chat", "completions", "models", "responses", "embeddings", "rerank", "messages")


def meant_path(path: str) -> str | None:
    """The route a wrong base URL turned into ``path``, or None when it is no such slip."""
    if path.startswith("/v1/v1/"):
        return path[len("/v1") :]
    first = path.lstrip("/").split("/", 1)[0]
    if first in _V1_ROUTES:
        return "/v1" + path
    return None


def route_hint(path: str) -> str:
    """How to fix the base URL that produced ``path``, or empty."""
    meant = meant_path(path)
    if meant is None:
        return ""
    if path.startswith("/v1/v1/"):
        return (
            f"; did you mean {meant}? Drop /v1 from the client's base URL: Anthropic clients "
            "take http://HOST:PORT, OpenAI clients http://HOST:PORT/v1"
        )
    if meant.startswith("/v1/messages"):
        return (
            f"; did you mean {meant}? Anthropic clients take the base URL http://HOST:PORT "
            "and add /v1/messages themselves"
        )
    return f"; did you mean {meant}? Add /v1 to the client's base URL: http://HOST:PORT/v1"


def openai_error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def anthropic_error_body(status: int, message: str) -> dict:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    if is_anthropic_path(path):
        return anthropic_error_body(status, message)
    return openai_error_body(status, message, param, code)


def _response(
    request: Request, status: int, message: str, param=None, code=None, headers=None
) -> Response:
    return Response(
        error_body(request.url.path, status, message, param, code),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


def handle_app_error(request: Request, exc: AppError) -> Response:
    status = status_of(exc)
    if status >= 500 and not isinstance(exc, ServerStopping):  # the stop has its own line
        log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
    return _response(request, status, exc.message, exc.param, exc.code, headers_of(exc) or None)


def handle_validation(request: Request, exc: ValidationException) -> Response:
    message, param = _describe_validation(exc)
    return _response(request, 400, message, param)


def handle_http(request: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    if isinstance(exc, NotFoundException):
        message = f"no route {request.method} {request.url.path}{route_hint(request.url.path)}"
    elif isinstance(exc, MethodNotAllowedException):
        message = f"method {request.method} not allowed on {request.url.path}"
    elif status == 413:
        limit = request.route_handler.resolve_request_max_body_size()
        message = f"the request body is larger than this server's limit of {limit} bytes"
    else:
        message = str(exc.detail)
    return _response(request, status, message, headers=exc.headers)


def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _response(request, HTTP_500_INTERNAL_SERVER_ERROR, "internal server error")


def _describe_validation(exc: ValidationException) -> tuple[str, str | None]:
    """Litestar's msgspec errors as one readable line and the offending field."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    for item in extra:
        if isinstance(item, dict):
            message = str(item.get("message", exc.detail))
            key = item.get("key")
            param = None
            if isinstance(key, str) and key:
                param = key.removeprefix("$.")
            elif "at `$." in message:
                param = message.rsplit("at `$.", 1)[1].rstrip("`")
            if param and param not in message:  # Anthropic's envelope has no param field
                message = f"{message} - at `{param}`"
            return message, param
    detail = str(exc.detail)
    if "JSON is malformed" in detail or "malformed" in detail.lower():
        return "the request body is not valid JSON", None
    return detail, None


EXCEPTION_HANDLERS = {
    AppError: handle_app_error,
    ValidationException: handle_validation,
    HTTPException: handle_http,
    Exception: handle_unexpected,
}
