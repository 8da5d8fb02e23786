"""Forwarding one request to a worker, and its answer or stream back, with retries.

A request goes to the worker the policy picks. If that worker fails before anything was sent to
the client (it refuses the connection, drops it, or answers 503), the request is tried on another
healthy worker, each at most once. A stream is committed once the worker's first event has
arrived; from then on events are relayed as they arrive (a partly received event waits only for
its own end), and a worker failing mid-stream ends the client's stream with an error event and
`[DONE]`. The client's headers, its Authorization included, go to the worker unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fastdeploy.client_disconnects import ClientDisconnected, unless_disconnected
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
    }
)
#: the end of a server-sent event
_EVENT_END = re.compile(rb"\r?\n\r?\n")
DONE_EVENT = b"data: [DONE]\n\n"


class WorkerFailed(Exception):
    """The worker failed before the client was sent anything: the request may go elsewhere."""


class Proxy:
    """Sends requests to workers chosen by `policy` over `client` (connections are pooled)."""

    def __init__(
        self, workers: WorkerSet, policy: Policy, client: httpx.AsyncClient, metrics: RouterMetrics
    ) -> None:
        self.workers = workers
        self.policy = policy
        self.client = client
        self.metrics = metrics

    async def forward(self, request: Request, path: str) -> Response:
        """The answer to `request` from a worker's `path`, or a 503 if no worker could give one."""
        body = await request.body()
        parsed = json_or_none(body)
        streaming = isinstance(parsed, dict) and parsed.get("stream") is True
        headers = forwarded_headers(request)
        tried: set[Worker] = set()
        reasons: list[str] = []
        while True:
            candidates = [w for w in self.workers.available() if w not in tried]
            if not candidates:
                break
            worker = self.policy.choose(candidates, parsed)
            tried.add(worker)
            try:
                return await self.attempt(
                    request, worker, path, body, headers, streaming, len(candidates) > 1
                )
            except ClientDisconnected:
                return Response(status_code=499)
            except WorkerFailed as exc:
                reasons.append(f"{worker.url}: {exc}")
                self.metrics.retries.labels(worker.url).inc()
                logger.warning(
                    "request to %s failed before any answer (%s); trying another worker", worker.url, exc
                )
        self.metrics.unserved.inc()
        detail = "; ".join(reasons) if reasons else "no worker is healthy"
        return error_response(503, f"no worker could serve the request ({detail})")

    async def attempt(
        self,
        request: Request,
        worker: Worker,
        path: str,
        body: bytes,
        headers: dict,
        streaming: bool,
        may_retry: bool,
    ) -> Response:
        """The worker's answer; raises WorkerFailed if it failed before answering (or answered 503
        while another worker may take the request)."""
        worker.outstanding += 1
        handed_over = False
        try:
            upstream, events, first = await unless_disconnected(
                self._open(worker, path, body, headers, streaming, may_retry), request
            )
            if events is None:
                self._count(worker, upstream.status_code)
                return Response(
                    upstream.content, status_code=upstream.status_code, headers=answer_headers(upstream)
                )
            handed_over = True
            return StreamingResponse(
                self._relay(worker, upstream, events, first),
                status_code=upstream.status_code,
                headers=answer_headers(upstream),
            )
        except httpx.TransportError as exc:
            reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self.workers.mark_failed(worker, reason)
            raise WorkerFailed(reason) from None
        finally:
            if not handed_over:
                worker.outstanding -= 1

    async def _open(
        self, worker: Worker, path: str, body: bytes, headers: dict, streaming: bool, may_retry: bool
    ) -> tuple[httpx.Response, AsyncIterator[bytes] | None, bytes]:
        """The worker's answer read whole (no event iterator), or, for a stream, read up to the end
        of its first event; closed unless a stream is handed back."""
        sent = self.client.build_request("POST", worker.url + path, content=body, headers=headers)
        upstream = await self.client.send(sent, stream=True)
        try:
            if upstream.status_code == 503 and may_retry:
                raise WorkerFailed("it answered 503")
            if streaming and upstream.status_code == 200:
                events = upstream.aiter_raw()
                return upstream, events, await _first_events(events)
            await upstream.aread()
        except BaseException:
            await _closed(upstream)
            raise
        await _closed(upstream)
        return upstream, None, b""

    async def _relay(
        self, worker: Worker, upstream: httpx.Response, events: AsyncIterator[bytes], first: bytes
    ) -> AsyncIterator[bytes]:
        """`first`, then each complete event as it arrives; an error event and [DONE] if the worker
        fails. Closes the worker's answer however it ends (the client leaving included)."""
        outcome = "ok"
        try:
            yield first
            pending = b""
            async for data in events:
                pending += data
                end = _last_event_end(pending)
                if end:
                    yield pending[:end]
                    pending = pending[end:]
            if pending:
                yield pending
        except httpx.TransportError as exc:
            outcome = "stream_failed"
            reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self.workers.mark_failed(worker, reason)
            logger.warning("worker %s failed mid-stream: %s", worker.url, reason)
            yield _error_event(f"the worker serving this stream failed ({reason})")
            yield DONE_EVENT
        finally:
            self.metrics.requests.labels(worker.url, outcome).inc()
            await _closed(upstream)
            worker.outstanding -= 1

    def _count(self, worker: Worker, status: int) -> None:
        self.metrics.requests.labels(worker.url, "ok" if status < 400 else "http_error").inc()


async def _first_events(events: AsyncIterator[bytes]) -> bytes:
    """The stream's bytes up to the end of its first whole event (or all of it, if shorter)."""
    received = b""
    async for data in events:
        received += data
        if _last_event_end(received):
            break
    return received


def _last_event_end(data: bytes) -> int:
    """Where the last complete event in `data` ends (0: none complete yet)."""
    end = 0
    for match in _EVENT_END.finditer(data):
        end = match.end()
    return end


async def _closed(upstream: httpx.Response) -> None:
    """Close the worker's answer even while this task is being cancelled."""
    with anyio.CancelScope(shield=True):
        await upstream.aclose()


def forwarded_headers(request: Request) -> dict[str, str]:
    """The client's headers that go on to the worker (Authorization included)."""
    return {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}


def answer_headers(upstream: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_FORWARDED}


def json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _error_body(message: str) -> dict:
    return {"error": {"message": message, "type": "service_unavailable", "param": None, "code": 503}}


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(_error_body(message), status_code=status)


def _error_event(message: str) -> bytes:
    return b"data: " + json.dumps(_error_body(message)).encode() + b"\n\n"
