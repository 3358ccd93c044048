"""A large request body streamed into a temporary file, within a named limit (cache imports).

The app-wide ``max_request_body_bytes`` is for JSON; an archive may be gigabytes. Its
route has no Litestar limit and reads the body chunk by chunk into a spooled temporary
file (in memory while small, then on disk, private to the server's user), counting as it
goes. Over the limit, the answer is a 413 that names the setting and its value: at once
when ``Content-Length`` says so, before any of the body is read (a client that sent
``Expect: 100-continue``, as the CLI and curl do, then never sends it).
"""

from __future__ import annotations

import tempfile
from typing import IO

import anyio
from litestar import Request
from litestar.exceptions import InternalServerException

from omlx.app.errors import ClientGone, InvalidRequest, TooLarge

IN_MEMORY_BYTES = 8 << 20  # a spool this small stays in RAM


def refuse_if_announced_over(request: Request, limit: int, setting: str) -> None:
    """413 now if ``Content-Length`` is over ``limit`` (nothing of the body is read)."""
    announced = request.headers.get("content-length")
    if announced is None:
        return
    try:
        size = int(announced)
    except ValueError:
        raise InvalidRequest(
            f"content-length {announced!r} is not a number", param="content-length"
        ) from None
    if size > limit:
        raise too_large(size, limit, setting)


async def spool_body(request: Request, limit: int, setting: str) -> IO[bytes]:
    """The request body in a temporary file, rewound; 413 (naming ``setting``) past ``limit``."""
    refuse_if_announced_over(request, limit, setting)
    spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY_BYTES)  # noqa: SIM115
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise too_large(received, limit, setting, at_least=True)
            if received > IN_MEMORY_BYTES:  # on disk by now: write off the event loop
                await anyio.to_thread.run_sync(spool.write, chunk)
            else:
                spool.write(chunk)
    except InternalServerException as exc:  # Litestar's word for a client that went away
        spool.close()
        raise ClientGone("the client closed the connection during the upload") from exc
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool


def too_large(size: int, limit: int, setting: str, *, at_least: bool = False) -> TooLarge:
    more = "more than " if at_least else ""
    return TooLarge(
        f"the body is {more}{size} bytes; this server accepts at most {limit} "
        f"({setting} = {limit}, --{setting.replace('_', '-')})",
        param=setting,
        code="request_too_large",
    )
