"""uvicorn's server with a drain that ends every response properly, and an exit code.

On SIGTERM (or Ctrl+C) uvicorn stops listening, waits up to `timeout_graceful_shutdown` seconds
for the running requests, then cancels their handlers: streams are cut mid-body (the client sees
an incomplete chunked read, no final chunk, no `[DONE]`) and the log fills with "Exception in
ASGI application" tracebacks. This server instead, at the deadline:

1. aborts every engine request (`AsyncLLMEngine.abort_all`), so each stream's handler receives a
   final output with `finish_reason: "abort"`, sends it, then `[DONE]`, and closes its body the
   normal way; a non-streaming request answers 503 `server_shutting_down`;
2. closes connections still sending their request (nothing was started for them);
3. waits `abort_grace` seconds for those handlers to finish (one engine step at most, normally);
4. only then cancels what is left, as uvicorn would.

The handled signal is not re-raised after the drain (uvicorn's default, which kills the process
with that signal): a server that drained cleanly exits 0. `exit_code` is 1 when the server shut
itself down because its engine became unusable (`fail`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

import h11
import uvicorn

from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: seconds handlers get to send their final chunk after the engine requests were aborted
ABORT_GRACE_SECONDS = 10.0


class GracefulServer(uvicorn.Server):
    """`uvicorn.Server` whose shutdown aborts engine requests at the deadline instead of cancelling."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        on_drain: Callable[[], None],
        on_deadline: Callable[[], None],
        abort_grace: float = ABORT_GRACE_SECONDS,
    ) -> None:
        super().__init__(config)
        self.on_drain = on_drain
        self.on_deadline = on_deadline
        self.abort_grace = abort_grace
        self.exit_code = 0

    def fail(self, reason: str) -> None:
        """Shut down with exit status 1 (thread-safe: sets flags uvicorn's main loop polls)."""
        logger.error("shutting the server down: %s", reason)
        self.exit_code = 1
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list | None = None) -> None:
        logger.info(
            "shutting down: no new connections; running requests get %s s",
            self.config.timeout_graceful_shutdown,
        )
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        self.on_drain()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle keep-alive connections close now, busy ones after their response
        if not await self._wait_until_idle(self.config.timeout_graceful_shutdown):
            logger.warning(
                "shutdown timeout reached: aborting the %d running request(s)", len(self.server_state.tasks)
            )
            self.on_deadline()
            self._close_unstarted_requests()
            if not await self._wait_until_idle(self.abort_grace):
                logger.error(
                    "cancelling %d request handler(s) that did not finish", len(self.server_state.tasks)
                )
                for task in self.server_state.tasks:
                    task.cancel()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _wait_until_idle(self, timeout: float | None) -> bool:
        """Wait until no connection or handler is left; False if `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        state = self.server_state
        while (state.connections or state.tasks) and not self.force_exit:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def _close_unstarted_requests(self) -> None:
        """Close connections whose client is still sending a request (no engine work behind them)."""
        for connection in list(self.server_state.connections):
            conn = getattr(connection, "conn", None)
            if conn is not None and conn.their_state in (h11.IDLE, h11.SEND_BODY):
                connection.transport.close()
