"""Noticing that an HTTP client went away while its answer is being prepared.

Shared by the OpenAI server (a disconnected client's engine requests are aborted) and the router
(its worker's connection is closed, so the worker stops generating): both do their work beside
a watcher of the ASGI receive channel and cancel the work when the client disconnects first.
The server awaits its work as a task of its own (`unless_disconnected`); the router, whose every
request pays for an extra task and a wait, works in the request's own task, which the watcher
cancels (`cancelled_if_disconnected`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request
from starlette.types import Receive

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def until_disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body must have been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(work: Awaitable[T], request: Request) -> T:
    """Await `work`; if the client goes away first, cancel it and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is cancelling this handler: stop the work too
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientDisconnected()


@contextlib.asynccontextmanager
async def cancelled_if_disconnected(receive: Receive) -> AsyncIterator[None]:
    """Run the block in the calling task; if the client goes away first, cancel the block and
    raise ClientDisconnected (the request's body must have been read already)."""
    task = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    # an ASGI server also answers http.disconnect once the response is complete: by then the
    # block has left (no await after its last send), so the watcher is cancelled before it runs
    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if not gone:
            raise  # the server is cancelling the request
        task.uncancel()
        raise ClientDisconnected() from None
    finally:
        watcher.cancel()
