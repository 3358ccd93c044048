"""What the app's services raise when a request cannot be served; ``api/errors.py`` maps each
to an HTTP status in the route's own envelope (OpenAI, Anthropic), so no service knows HTTP."""

from __future__ import annotations


class AppError(Exception):
    """A request the app refuses or could not finish; ``message`` is shown to the client."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request field at fault, where one is
        self.code = code  # a stable machine-readable reason


class InvalidRequest(AppError):
    """The client's mistake: a bad field, a prompt too long, a parameter omlx cannot honour."""


class TooLarge(InvalidRequest):
    """A body over a configured limit (413); the message names the setting and its value."""


class Unauthorized(AppError):
    """No API key, or the wrong one."""


class Forbidden(AppError):
    """A known key asking for what its role may not do (a tenant's key on an operator action)."""


class NotFound(AppError):
    """A model, a stored response or another named thing that does not exist."""


class Busy(AppError):
    """Too many requests wait already; retry after ``retry_after`` seconds."""

    def __init__(
        self, message: str, *, retry_after: int = 1, code: str | None = "queue_full"
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class ClientGone(AppError):
    """The client closed the connection before the answer was ready."""


class GenerationFailed(AppError):
    """The engine could not produce an answer (not the client's fault)."""


class ModelUnavailable(AppError):
    """The model could not be loaded (its files, or the machine): retrying may not help."""


class ServerStopping(AppError):
    """The server is stopping (SIGINT or SIGTERM): the request is refused or cut, never run."""

    def __init__(
        self, message: str = "the server is stopping; retry once it has restarted"
    ) -> None:
        super().__init__(message, code="server_stopping")


class StoreUnavailable(AppError):
    """The stored-responses database cannot be used now (down, full, read-only): retry later."""
