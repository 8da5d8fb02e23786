"""uvicorn's h11 connection protocol with read deadlines: stalled clients are dropped.

uvicorn times out only idle keep-alive connections: a client that sends half a request line, or
headers without the blank line that ends them, or announces a body and then stops, holds its
connection (and a file descriptor) forever. The request never reaches the ASGI app, so no
middleware can see it; the deadline has to live in the connection protocol. uvicorn takes the
protocol class as `Config(http=...)`, so this subclass adds two timers, as nginx does:

- `header_timeout`: from the first byte of a request (or from the connection's opening) until its
  head is complete. On expiry the client gets `408 Request Timeout` and the connection closes.
- `body_timeout`: the longest pause between two reads of a request body. On expiry the connection
  closes; the handler waiting for the body sees a disconnect.

Everything else is uvicorn's own code; only the arming and disarming of the timers is added.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from fastdeploy.logger import get_logger

logger = get_logger(__name__)

_TIMEOUT_BODY = b"request head not received in time"
#: sent when a request's head does not arrive in time (the connection closes right after); written
#: as bytes because h11 cannot answer a request whose head it has not parsed
REQUEST_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    + f"content-length: {len(_TIMEOUT_BODY)}\r\n\r\n".encode()
    + _TIMEOUT_BODY
)


class DeadlineH11Protocol(H11Protocol):
    """`H11Protocol` with a header-read deadline and a body-read idle deadline.

    The deadlines are class attributes because uvicorn builds one protocol object per connection
    from the class alone; `with_timeouts` makes a configured subclass.
    """

    header_timeout: float = 60.0
    body_timeout: float = 60.0
    #: called with "request_timeout" or "body_timeout" when a connection is dropped (metrics)
    on_timeout: Callable[[str], None] = staticmethod(lambda kind: None)

    @classmethod
    def with_timeouts(
        cls, header_timeout: float, body_timeout: float, on_timeout: Callable[[str], None] | None = None
    ) -> type[DeadlineH11Protocol]:
        settings: dict[str, object] = {"header_timeout": header_timeout, "body_timeout": body_timeout}
        if on_timeout is not None:
            settings["on_timeout"] = staticmethod(on_timeout)
        return type(cls.__name__, (cls,), settings)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm(self.header_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        reading_head = self.conn.their_state is h11.IDLE
        if reading_head and self._read_deadline is None:  # the first bytes of a new request
            self._arm(self.header_timeout, self._head_timed_out)
        super().data_received(data)
        self._rearm_after_read(reading_head)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._rearm_after_read(reading_head=False)

    def _rearm_after_read(self, reading_head: bool) -> None:
        """Keep, move or drop the deadline according to what the client must send next."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm(self.body_timeout, self._body_timed_out)
        elif state is not h11.IDLE or not reading_head:
            # the request is complete (or the connection is idle after a response, which is
            # uvicorn's keep-alive timeout's business)
            self._disarm()

    def _arm(self, seconds: float, callback: object) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(seconds, callback)  # type: ignore[arg-type]

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _head_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        logger.info(
            "closing connection from %s: request head not received in %.0f s",
            self.client,
            self.header_timeout,
        )
        if self.conn.our_state in (h11.IDLE, h11.DONE):  # nothing of ours is on the wire mid-response
            self.transport.write(REQUEST_TIMEOUT_RESPONSE)
        self.transport.close()
        self.on_timeout("request_timeout")

    def _body_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        logger.info(
            "closing connection from %s: request body stalled for %.0f s", self.client, self.body_timeout
        )
        self.transport.close()  # the handler waiting in receive() sees a disconnect
        self.on_timeout("body_timeout")
