"""The FastAPI application: routes, API-key check, OpenAI-style error bodies, engine lifecycle.

The engine thread starts with the application (lifespan startup) and stops after the server has
drained its connections (lifespan shutdown), so a SIGTERM lets running requests finish first.
`build_app` returns the FastAPI app wrapped in `RequestGuard` (body size and content type are
refused before any route runs).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp

from fastdeploy import __version__
from fastdeploy.entrypoints.openai.errors import OpenAIError, redact_paths
from fastdeploy.entrypoints.openai.http_guard import DEFAULT_MAX_REQUEST_BYTES, RequestGuard
from fastdeploy.entrypoints.openai.metrics import CONTENT_TYPE, ServerMetrics
from fastdeploy.entrypoints.openai.responses_input import ResponsesRequest
from fastdeploy.entrypoints.openai.serving import ServingContext, as_openai_error
from fastdeploy.entrypoints.openai.serving_chat import create_chat_completion
from fastdeploy.entrypoints.openai.serving_completion import create_completion
from fastdeploy.entrypoints.openai.serving_embedding import create_embedding
from fastdeploy.entrypoints.openai.serving_responses import (
    create_response,
    delete_response,
    retrieve_response,
)
from fastdeploy.entrypoints.openai.serving_tokens import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    detokenize,
    tokenize,
)
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

#: `code` of the errors Starlette raises itself (unknown route, wrong method)
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_response(error: OpenAIError, metrics: ServerMetrics) -> JSONResponse:
    """`error` as its JSON response, counted in the metrics by kind."""
    metrics.count_error(error.kind)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def build_app(ctx: ServingContext, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> ASGIApp:
    """An ASGI app serving `ctx`'s engine; running it (lifespan) starts and stops the engine thread."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        ctx.engine.start()
        try:
            yield
        finally:
            ctx.engine.shutdown()
            ctx.close()

    app = FastAPI(title="fastdeploy OpenAI-compatible API", version=__version__, lifespan=lifespan)
    app.state.ctx = ctx
    started = int(time.time())

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc, ctx.metrics)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code)
        error = OpenAIError(exc.status_code, str(exc.detail), code=code, headers=exc.headers)
        return error_response(error, ctx.metrics)

    async def check_api_key(request: Request) -> None:
        if ctx.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), ctx.api_key.encode()
        ):
            reason = "is missing" if not header else "is not valid"
            raise OpenAIError(
                401,
                f"The API key {reason}; send it as 'Authorization: Bearer <key>' (the server's --api-key)",
                code="invalid_api_key",
            )

    authorized = [Depends(check_api_key)]

    @app.get("/health")
    async def health() -> Response:
        if ctx.engine.fatal_error is not None:
            reason = redact_paths(str(ctx.engine.fatal_error))
            return JSONResponse({"status": "dead", "reason": reason}, status_code=503)
        if not ctx.engine.is_running or not ctx.engine.is_accepting:
            return JSONResponse({"status": "stopping"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> Response:
        return JSONResponse({"version": __version__})

    @app.get("/metrics", dependencies=authorized if ctx.metrics_require_api_key else [])
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=authorized)
    async def models() -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": started,
                "owned_by": "fastdeploy",
                "root": ctx.model_root or name,
                "parent": None,
                "max_model_len": ctx.max_model_len,
            }
            for name in ctx.served_model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(request: Request) -> Response:
        return await _serve(create_completion, ctx, request)

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(request: Request) -> Response:
        return await _serve(create_chat_completion, ctx, request)

    @app.post("/v1/embeddings", dependencies=authorized)
    async def embeddings(request: Request) -> Response:
        return await _serve(create_embedding, ctx, request, runner="pooling")

    @app.post("/v1/responses", dependencies=authorized, openapi_extra=json_body(ResponsesRequest))
    async def responses(request: Request) -> Response:
        return await _serve(create_response, ctx, request)

    @app.get("/v1/responses/{response_id}", dependencies=authorized)
    async def get_response(request: Request, response_id: str) -> Response:
        return await _serve(retrieve_response, ctx, request)

    @app.delete("/v1/responses/{response_id}", dependencies=authorized)
    async def forget_response(request: Request, response_id: str) -> Response:
        return await _serve(delete_response, ctx, request)

    @app.post(
        "/tokenize",
        dependencies=authorized,
        openapi_extra=json_body(TokenizeRequest),
        responses={200: {"model": TokenizeResponse}},
    )
    async def tokenize_route(request: Request) -> Response:
        return await _serve(tokenize, ctx, request, runner=None)

    @app.post(
        "/detokenize",
        dependencies=authorized,
        openapi_extra=json_body(DetokenizeRequest),
        responses={200: {"model": DetokenizeResponse}},
    )
    async def detokenize_route(request: Request) -> Response:
        return await _serve(detokenize, ctx, request, runner=None)

    return RequestGuard(app, max_request_bytes, on_refusal=ctx.metrics.count_error)


def check_runner(ctx: ServingContext, runner: str, path: str) -> None:
    """400 for an endpoint of the other runner: a pooling server only embeds, a generating one
    only generates."""
    if ctx.runner == runner:
        return
    if ctx.runner == "pooling":
        what = "embeds (--runner pooling): it serves /v1/embeddings"
    else:
        what = (
            "generates (--runner generate): it serves /v1/completions, /v1/chat/completions and /v1/responses"
        )
    raise OpenAIError(
        400,
        f"{path} needs a server started with --runner {runner}; this server {what}",
        code="wrong_runner",
    )


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI's description of a JSON body of `model` (handlers read the raw body themselves,
    so that errors follow the OpenAI contract rather than FastAPI's 422)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def _serve(
    handler: Callable[[ServingContext, Request], Awaitable[Response]],
    ctx: ServingContext,
    request: Request,
    runner: str | None = "generate",
) -> Response:
    """Run an endpoint of `runner`'s server (None: of either); any failure becomes an OpenAI-style
    error response."""
    try:
        if runner is not None:
            check_runner(ctx, runner, request.url.path)
        return await handler(ctx, request)
    except ClientDisconnect:  # gone while sending its body (or dropped by --body-timeout)
        return Response(status_code=499)
    except Exception as exc:
        error = as_openai_error(exc)
        if error.status >= 500:
            logger.warning("request to %s failed: %s", request.url.path, error.message)
        return error_response(error, ctx.metrics)
