"""An ASGI middleware that refuses, before any handler runs, what no endpoint should process.

- A body larger than `max_body_bytes` gets 413. When the client declares its size
  (`Content-Length`) the answer goes out before one byte of the body is read; a chunked body is
  counted as it arrives and refused as soon as it passes the limit. What the client still sends
  is discarded by the HTTP layer (reading it out keeps the 413 readable: closing a socket with
  unread data resets it, and the client would see a reset instead of the answer).
- A `POST` to the API (`/v1/...`) whose `Content-Type` is not `application/json` gets 415, as
  vLLM answers. A JSON body sent as `text/plain` or a form is a client bug worth naming.

Both answers are OpenAI-style error bodies, like every other error of the server.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fastdeploy.entrypoints.openai.errors import OpenAIError

JSON_MEDIA_TYPE = "application/json"
#: largest request body accepted by default (413 beyond): a text prompt that fills a 128k-token
#: context is about 0.5 MB of JSON, a base64 photo 1 to 5 MB
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
_API_PREFIX = "/v1/"


def request_too_large(limit: int) -> OpenAIError:
    return OpenAIError(
        413,
        f"The request body is larger than this server accepts ({limit} bytes, the server's "
        "--max-request-size); send a smaller request",
        code="request_too_large",
    )


def json_content_type_error(content_type: str | None) -> OpenAIError | None:
    """None for `application/json` (parameters such as `; charset=utf-8` allowed), else the 415."""
    if content_type and content_type.split(";", 1)[0].strip().lower() == JSON_MEDIA_TYPE:
        return None
    shown = repr(content_type) if content_type else "none"
    message = f"Unsupported Content-Type {shown}: send the request body as JSON with 'Content-Type: application/json'"
    return OpenAIError(415, message, code="unsupported_media_type")


async def send_error(send: Send, error: OpenAIError) -> None:
    """Send `error` as a complete JSON response."""
    body = json.dumps(error.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", JSON_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """Checks body size and content type before the wrapped app sees the request."""

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, on_refusal: Callable[[str], None] | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        #: called with the kind of every refusal (the server's error metrics)
        self.on_refusal = on_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        error = None
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            error = request_too_large(self.max_body_bytes)
        elif scope["method"] == "POST" and scope["path"].startswith(_API_PREFIX):
            error = json_content_type_error(headers.get("content-type"))
        if error is not None:
            if self.on_refusal is not None:
                self.on_refusal(error.kind)
            await send_error(send, error)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        """`receive`, raising a 413 `OpenAIError` once the body passes the limit (chunked bodies)."""
        received = 0
        limit = self.max_body_bytes

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise request_too_large(limit)
            return message

        return counted
