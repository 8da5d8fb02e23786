"""Forwarding one request to a worker, and its answer or stream back, with retries.

This is the router's hot path, so it is a plain ASGI handler: the client's body goes to the
worker as the bytes it sent (parsed only when the policy reads the prompt), its headers as they
came (Authorization included), and the worker's answer comes back over a pooled keep-alive
connection (aiohttp, whose C parser costs a fraction of a pure-Python client's time).

A request goes to the worker the policy picks. If that worker fails before anything was sent to
the client (it refuses the connection, drops it, or answers 503), the request is tried on another
healthy worker, each at most once. A stream (an answer of type text/event-stream) is committed
once the worker's first event has arrived; from then on events are relayed as they arrive (bytes
that end on an event boundary go on at once, a partly received event waits only for its own end),
and a worker failing mid-stream ends the client's stream with an error event and `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from fastdeploy.client_disconnects import ClientDisconnected, cancelled_if_disconnected
from fastdeploy.logger import get_logger
from fastdeploy.router.metrics import RouterMetrics
from fastdeploy.router.policies import Policy
from fastdeploy.router.workers import Worker, WorkerSet

logger = get_logger(__name__)

#: headers that describe one connection, not the request or answer (RFC 9110 7.6.1), and those
#: the forwarding HTTP client or server sets itself
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
        "date",
        "server",
        "expect",  # the router has read the whole body already
    }
)
_NOT_FORWARDED_BYTES = frozenset(name.encode() for name in _NOT_FORWARDED)
#: the end of a server-sent event
_EVENT_END = re.compile(rb"\r?\n\r?\n")
DONE_EVENT = b"data: [DONE]\n\n"
#: how a worker's connection fails under a request (refused, reset, closed mid-answer, timed out)
WORKER_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
#: what a forwarding coroutine is given: where to send the answer, the path, the body, the headers
Forward = Callable[[Send, str, bytes, list[tuple[str, str]]], Awaitable[None]]


class WorkerFailed(Exception):
    """The worker failed before the client was sent anything: the request may go elsewhere."""


@dataclass
class Answer:
    """A whole answer to send to the client (the router's own, or a worker's read in full)."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]

    async def send(self, send: Send) -> None:
        headers = [*self.headers, (b"content-length", str(len(self.body)).encode())]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


def new_session(connect_timeout: float) -> aiohttp.ClientSession:
    """The pooled client for forwarded requests: no read timeout (a long generation is not a
    failure), no cookie jar, keep-alive connections dropped before a worker's own idle timeout
    (uvicorn's 5 s) would close one under a request, answers uncompressed so streams go on byte
    for byte."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0, ttl_dns_cache=60)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout),
        headers={"accept-encoding": "identity"},
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),  # one client's cookies are not another's
        skip_auto_headers=("User-Agent",),
    )


async def serve(scope: Scope, receive: Receive, send: Send, forward: Forward) -> None:
    """Read the client's request and run `forward` on it, cancelled if the client leaves."""
    try:
        body = await read_body(receive)
        async with cancelled_if_disconnected(receive):
            await forward(send, scope["path"], body, request_headers(scope))
    except ClientDisconnected:
        pass  # nothing to answer; the worker's connection was closed with the cancelled work


class Proxy:
    """Sends requests to workers chosen by `policy` over `session` (connections are pooled)."""

    def __init__(
        self,
        workers: WorkerSet,
        policy: Policy,
        session: aiohttp.ClientSession,
        metrics: RouterMetrics,
    ) -> None:
        self.workers = workers
        self.policy = policy
        self.session = session
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI handler of a forwarded path."""
        await serve(scope, receive, send, self.forward)

    async def forward(self, send: Send, path: str, body: bytes, headers: list[tuple[str, str]]) -> None:
        """Send the client a worker's answer from `path`, or a 503 if no worker could give one."""
        request = json_or_none(body) if self.policy.reads_request else None
        tried: set[Worker] = set()
        reasons: list[str] = []
        while candidates := [w for w in self.workers.available() if w not in tried]:
            worker = self.policy.choose(candidates, request)
            tried.add(worker)
            try:
                await self.attempt(send, worker, path, body, headers, len(candidates) > 1)
                return
            except WorkerFailed as exc:
                reasons.append(f"{worker.url}: {exc}")
                self.metrics.retries.labels(worker.url).inc()
                logger.warning(
                    "request to %s failed before any answer (%s); trying another worker", worker.url, exc
                )
        self.metrics.unserved.inc()
        detail = "; ".join(reasons) if reasons else "no worker is healthy"
        await error_answer(503, f"no worker could serve the request ({detail})").send(send)

    async def attempt(
        self,
        send: Send,
        worker: Worker,
        path: str,
        body: bytes,
        headers: list[tuple[str, str]],
        may_retry: bool,
    ) -> None:
        """Send the client `worker`'s answer; raises WorkerFailed if the worker failed before
        answering (or answered 503 while another worker may take the request)."""
        worker.outstanding += 1
        upstream: aiohttp.ClientResponse | None = None
        try:
            try:
                upstream = await self.session.post(worker.url + path, data=body, headers=headers)
                if upstream.status == 503 and may_retry:
                    raise WorkerFailed("it answered 503")
                if upstream.status == 200 and upstream.content_type == "text/event-stream":
                    answer, head = None, await _first_events(upstream.content)
                else:
                    answer = Answer(upstream.status, await upstream.read(), answer_headers(upstream))
            except WORKER_ERRORS as exc:
                reason = describe(exc)
                self.workers.mark_failed(worker, reason)
                raise WorkerFailed(reason) from None
            if answer is None:
                outcome = await self._relay(send, worker, upstream, *head)
            else:
                outcome = "ok" if answer.status < 400 else "http_error"
                await answer.send(send)
            self.metrics.requests.labels(worker.url, outcome).inc()
        finally:
            worker.outstanding -= 1
            if upstream is not None:
                upstream.close()  # a no-op once the answer was read to its end (pooled again)

    async def _relay(
        self, send: Send, worker: Worker, upstream: aiohttp.ClientResponse, first: bytes, rest: bytes
    ) -> str:
        """Send the stream's head and `first` events, then each complete event as it arrives; an
        error event and [DONE] if the worker fails. Returns the outcome for the metrics."""
        await send(
            {"type": "http.response.start", "status": upstream.status, "headers": answer_headers(upstream)}
        )
        await send({"type": "http.response.body", "body": first, "more_body": True})
        pending = rest
        outcome = "ok"
        try:
            while data := await upstream.content.readany():
                if not pending and data.endswith(b"\n\n"):  # the usual case: whole events
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                    continue
                pending += data
                end = _last_event_end(pending)
                if end:
                    await send({"type": "http.response.body", "body": pending[:end], "more_body": True})
                    pending = pending[end:]
        except WORKER_ERRORS as exc:
            outcome = "stream_failed"
            reason = describe(exc)
            self.workers.mark_failed(worker, reason)
            logger.warning("worker %s failed mid-stream: %s", worker.url, reason)
            pending = _error_event(f"the worker serving this stream failed ({reason})") + DONE_EVENT
        await send({"type": "http.response.body", "body": pending})
        return outcome


async def _first_events(content: aiohttp.StreamReader) -> tuple[bytes, bytes]:
    """The stream's bytes up to the end of its last whole event once one has arrived, and what
    came after it (the start of the next event); all of it if the stream ends sooner."""
    received = b""
    while data := await content.readany():
        received += data
        end = _last_event_end(received)
        if end:
            return received[:end], received[end:]
    return received, b""


def _last_event_end(data: bytes) -> int:
    """Where the last complete event in `data` ends (0: none complete yet)."""
    if data.endswith(b"\n\n"):
        return len(data)
    end = 0
    for match in _EVENT_END.finditer(data):
        end = match.end()
    return end


async def read_body(receive: Receive) -> bytes:
    """The client's whole request body (raises ClientDisconnected if it leaves first)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def request_headers(scope: Scope) -> list[tuple[str, str]]:
    """The client's headers that go on to the worker (Authorization included)."""
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in scope["headers"]
        if name.lower() not in _NOT_FORWARDED_BYTES
    ]


def forwarded_headers(request: Request) -> dict[str, str]:
    """The client's headers that go on to a worker, for the router's own (httpx) requests."""
    return {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}


def answer_headers(upstream: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    """The worker's answer headers that go back to the client."""
    return [
        (name.lower(), value)
        for name, value in upstream.raw_headers
        if name.lower() not in _NOT_FORWARDED_BYTES
    ]


def describe(exc: BaseException) -> str:
    """What went wrong with a worker's connection, for logs and the client's error."""
    text = str(exc)
    if isinstance(exc, asyncio.TimeoutError) and not text:
        text = "timed out"
    return f"{type(exc).__name__}: {text}".rstrip(": ")


def json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _error_body(message: str) -> dict:
    return {"error": {"message": message, "type": "service_unavailable", "param": None, "code": 503}}


def error_answer(status: int, message: str) -> Answer:
    """The router's own error answer, in the OpenAI error shape."""
    return Answer(status, json.dumps(_error_body(message)).encode(), [(b"content-type", b"application/json")])


def _error_event(message: str) -> bytes:
    return b"data: " + json.dumps(_error_body(message)).encode() + b"\n\n"
