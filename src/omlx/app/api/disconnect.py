"""Watching the ASGI connection while a non-streaming answer is computed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from omlx.app.errors import ClientGone

T = TypeVar("T")


async def unless_disconnected(receive: Callable[[], Awaitable[dict]], work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it (which cancels its generation).

    ``receive`` is the request's ASGI receive: once the body is read, its next message
    is ``http.disconnect``, and only when the client goes away.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise ClientGone("the client closed the connection")
    return task.result()


async def _wait_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    try:
        while (await receive()).get("type") != "http.disconnect":
            pass
    except Exception:  # a receive that cannot tell: never report a disconnect
        await asyncio.Event().wait()
