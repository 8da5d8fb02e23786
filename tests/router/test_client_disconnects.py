"""`cancelled_if_disconnected`, the router's way of noticing a client that left: the block runs
in the request's own task and is cancelled when the ASGI receive channel says http.disconnect."""

from __future__ import annotations

import asyncio

import pytest

from fastdeploy.client_disconnects import ClientDisconnected, cancelled_if_disconnected


class Channel:
    """An ASGI receive channel that says http.disconnect once `leave` is called."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.waiting = asyncio.Event()

    async def receive(self) -> dict:
        self.waiting.set()
        await self.left.wait()
        return {"type": "http.disconnect"}


def test_a_client_leaving_cancels_the_block_and_raises_client_disconnected():
    reached: list[str] = []

    async def run() -> None:
        channel = Channel()
        never = asyncio.Event()
        async with cancelled_if_disconnected(channel.receive):
            await channel.waiting.wait()  # the watcher is listening
            channel.left.set()
            await never.wait()  # the work: only a cancellation ends it
            reached.append("after the work")

    with pytest.raises(ClientDisconnected):
        asyncio.run(run())
    assert reached == []


def test_a_block_that_finishes_first_returns_and_stops_the_watcher():
    async def run() -> tuple[str, list[asyncio.Task]]:
        channel = Channel()
        async with cancelled_if_disconnected(channel.receive):
            await channel.waiting.wait()
            result = "answered"
        channel.left.set()  # a disconnect after the block must not cancel anything
        await asyncio.sleep(0)
        return result, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    result, others = asyncio.run(run())
    assert result == "answered" and others == []


def test_the_server_cancelling_the_request_is_a_cancellation_not_a_disconnect():
    async def run() -> None:
        channel = Channel()
        started = asyncio.Event()

        async def request() -> None:
            async with cancelled_if_disconnected(channel.receive):
                started.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(request())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
