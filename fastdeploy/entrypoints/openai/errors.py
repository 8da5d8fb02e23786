"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

Handlers raise `OpenAIError`; the app turns it into the JSON body clients (the `openai` package
included) parse into their own exception types. Streams that fail after the first byte send the
same body as a server-sent event instead.
"""

from __future__ import annotations

import re
from typing import Any

from fastdeploy.errors import InvalidArgumentError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class OpenAIError(Exception):
    """An error response: HTTP `status`, a message a user can act on, and the offending `param`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        type: str | None = None,  # noqa: A002 - OpenAI's field name
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        #: extra response headers (`Retry-After` on 503)
        self.headers = headers or {}

    @property
    def kind(self) -> str:
        """What the server's metrics count this error as: its `code`, else its `type`."""
        return self.code if isinstance(self.code, str) else self.type

    def body(self) -> dict[str, Any]:
        message = redact_paths(shortened(self.message))
        return {"error": {"message": message, "type": self.type, "param": self.param, "code": self.code}}


#: longest error message sent: messages quote what a request sent (a model name, a tool name),
#: and a 4 MB name must not come back as a 4 MB error
MAX_MESSAGE_CHARS = 2000


def shortened(message: str) -> str:
    """`message`, cut after MAX_MESSAGE_CHARS characters with a note of how many were cut."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return f"{message[:MAX_MESSAGE_CHARS]}... ({len(message) - MAX_MESSAGE_CHARS} more characters cut)"


#: the server's own routes, which messages may name
_API_ROUTES = "/v1/"
#: an absolute filesystem path with at least one directory, not inside a URL or a word
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/(?:[\w.@+~-]+/)+([\w.@+~-]+)")


def redact_paths(message: str) -> str:
    """`message` with absolute server paths cut to their last component.

    Errors from deep inside (a loader, a backend, a plugin) may name files on the server; a
    client needs the file's name at most, never the server's directory layout.
    """
    return _ABSOLUTE_PATH.sub(_last_component, message)


def _last_component(match: re.Match[str]) -> str:
    path = match.group(0)
    return path if path.startswith(_API_ROUTES) else match.group(1)


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """A 400 naming the parameter at fault."""
    return OpenAIError(400, message, param=param, code=code)


def unsupported(param: str, feature: str) -> OpenAIError:
    """A 400 for a parameter we understand but cannot honour yet (never silently ignored)."""
    return OpenAIError(
        400,
        f"'{param}' asks for {feature}, which this server does not support yet; remove it from the request",
        param=param,
        code="unsupported_parameter",
    )


_SAMPLING_FIELD = re.compile(r"SamplingParams\.(\w+)")


def from_sampling_error(exc: InvalidArgumentError, renames: dict[str, str] | None = None) -> OpenAIError:
    """A 400 for a `SamplingParams` validation error, naming the request field it came from.

    `renames` maps SamplingParams field names to the request's (e.g. logprobs -> top_logprobs).
    """
    match = _SAMPLING_FIELD.search(str(exc))
    field = match.group(1) if match else None
    param = (renames or {}).get(field, field) if field else None
    message = str(exc)
    if match and param:
        message = message.replace(match.group(0), param)
    return invalid_request(message, param=param)
