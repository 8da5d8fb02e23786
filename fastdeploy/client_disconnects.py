"""Noticing that an HTTP client went away while its answer is being prepared.

Shared by the OpenAI server (a disconnected client's engine requests are aborted) and the router
(its worker's connection is closed, so the worker stops generating): both await their work beside
a watcher of the ASGI receive channel and cancel the work when the client disconnects first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

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
