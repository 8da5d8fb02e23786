"""`POST /v1/responses` (OpenAI's Responses API), `GET` and `DELETE /v1/responses/{id}`.

A request becomes a chat request (`responses_input`) and runs through the chat endpoint's
preparation (`serving_chat.prepare_chat`): template, tools, structured outputs, media and limits
are the chat endpoint's. Its output becomes `output` items (`responses_output`); a streamed
response sends them as typed server-sent events (`event: response.output_text.delta` ...), each
with its `sequence_number`, and ends with `response.completed` (`response.incomplete` when cut at
`max_output_tokens`, `response.failed` when the server aborted it). A client that leaves a
stream aborts its engine request, which frees its sequence and KV blocks.

Finished responses are stored (unless `store: false`) in the bounded `ResponseStore`, which
`previous_response_id`, `GET` and `DELETE` read. Errors are the other endpoints' (errors.py);
the fields they name are the Responses request's (`input`, `max_output_tokens`, `text`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from fastdeploy.engine.request import CompletionOutput, RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.chat_tools import StreamedToolCalls, chat_message
from fastdeploy.entrypoints.openai.errors import OpenAIError, invalid_request
from fastdeploy.entrypoints.openai.metrics import ServerMetrics
from fastdeploy.entrypoints.openai.responses_input import (
    ResponsesRequest,
    chat_request,
    input_messages,
    reject_unsupported_fields,
)
from fastdeploy.entrypoints.openai.responses_output import (
    OutputItems,
    item_id,
    reasoning_tokens,
    response_usage,
)
from fastdeploy.entrypoints.openai.responses_store import StoredResponse
from fastdeploy.entrypoints.openai.serving import (
    ClientDisconnected,
    PreparedPrompt,
    ServingContext,
    as_openai_error,
    parse_body,
    refuse_aborted,
    unless_disconnected,
)
from fastdeploy.entrypoints.openai.serving_chat import prepare_chat
from fastdeploy.entrypoints.streaming import DeltaTracker
from fastdeploy.logger import get_logger
from fastdeploy.tool_calling.request import ToolPlan

logger = get_logger(__name__)

#: chat request fields -> the Responses fields they came from, for errors
_FIELD_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}
_FIELD_PATTERN = re.compile(r"\b(" + "|".join(_FIELD_NAMES) + r")\b")
#: how the chat layer names a content part (the chat message's index, the part's)
_CHAT_PART = re.compile(r"\bmessage (\d+) content part (\d+)")
#: what a stream's last event says when the server aborted the request (shutting down)
_ABORTED = "the server stopped this request before it finished (it is shutting down); retry it"


def not_found(response_id: str, param: str | None) -> OpenAIError:
    return OpenAIError(
        404,
        f"No response with id {response_id!r} is stored here: it was never stored (store: false), was "
        "deleted, or was forgotten to make room (the server keeps its --responses-store-size most "
        "recently used responses)",
        param=param,
        code="response_not_found",
    )


class _Turn:
    """One Responses request being served: its fields, conversation and response envelope."""

    def __init__(self, ctx: ServingContext, request: ResponsesRequest, model: str) -> None:
        self.ctx = ctx
        self.request = request
        self.model = model
        self.id = item_id("resp")
        self.created = int(time.time())
        history: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            stored = ctx.responses.get(request.previous_response_id)
            if stored is None:
                raise not_found(request.previous_response_id, "previous_response_id")
            history = stored.conversation
        messages, self._sources = input_messages(request.input)
        #: chat messages before this request's input: the instructions and the stored conversation
        self._before = len(history) + (1 if request.instructions else 0)
        self.conversation = [*history, *messages]

    def as_responses_error(self, error: OpenAIError) -> OpenAIError:
        """`error` of the chat preparation, naming the Responses request's fields (`input`,
        `max_output_tokens`, `text.format`) and the input item of a content part."""

        def part(match: re.Match[str]) -> str:
            index = int(match.group(1)) - self._before
            if not 0 <= index < len(self._sources):
                return match.group(0)  # a part of the stored conversation
            return f"{self._sources[index]}[{match.group(2)}]"

        message = _CHAT_PART.sub(part, error.message)
        message = _FIELD_PATTERN.sub(lambda match: _FIELD_NAMES[match.group(1)], message)
        param = _FIELD_NAMES.get(error.param or "", error.param)
        if param == "text.format":
            param = "text"
        return OpenAIError(
            error.status, message, param=param, code=error.code, type=error.type, headers=error.headers
        )

    def envelope(
        self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The response object (OpenAI's fields, the request's settings echoed)."""
        request = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": request.previous_response_id,
            "reasoning": {"effort": (request.reasoning or {}).get("effort"), "summary": None},
            "store": request.store is not False and self.ctx.responses.capacity > 0,
            "temperature": request.temperature,
            "text": request.text or {"format": {"type": "text"}},
            "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
            "tools": request.tools or [],
            "top_p": request.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": request.user,
            "metadata": request.metadata or {},
        }

    def finished(self, items: OutputItems, output: RequestOutput, sample: CompletionOutput) -> dict[str, Any]:
        """The finished response object; stored unless `store: false`."""
        end = self.ctx.engine.engine.reasoning_parser
        usage = response_usage(
            len(output.prompt_token_ids),
            output.num_cached_tokens,
            len(sample.token_ids),
            reasoning_tokens(sample, end.reasoning_end_token_ids() if end is not None else None),
        )
        status = "incomplete" if sample.finish_reason == "length" else "completed"
        body = self.envelope(status, items.items, usage)
        if self.request.store is not False:
            self.ctx.responses.put(self.id, StoredResponse(body, [*self.conversation, *items.messages()]))
        return body


async def create_response(ctx: ServingContext, raw: Request) -> Response:
    request = parse_body(ResponsesRequest, await raw.body())
    model = ctx.model_name(request.model)
    reject_unsupported_fields(request)
    turn = _Turn(ctx, request, model)
    chat = chat_request(request, turn.conversation)
    try:
        plan, params, prompt = await prepare_chat(ctx, chat)
    except OpenAIError as exc:
        raise turn.as_responses_error(exc) from exc
    if request.stream:
        ctx.admit(1)
        events = _guarded(_events(turn, prompt, params, plan), ctx.metrics)
        return StreamingResponse(events, media_type="text/event-stream")
    try:
        (output,) = await unless_disconnected(ctx.final_outputs(turn.id, [prompt], params), raw)
    except ClientDisconnected:
        return Response(status_code=499)
    refuse_aborted([output])
    sample = output.outputs[0]
    message, _ = chat_message(plan, sample)
    items = OutputItems()
    items.whole(message.get("content"), message.get("reasoning_content"), message.get("tool_calls"))
    items.finish("incomplete" if sample.finish_reason == "length" else "completed")
    return JSONResponse(turn.finished(items, output, sample))


async def retrieve_response(ctx: ServingContext, raw: Request) -> Response:
    response_id = raw.path_params["response_id"]
    if raw.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise invalid_request(
            "streaming a stored response again is not supported; retrieve it without stream", param="stream"
        )
    stored = ctx.responses.get(response_id)
    if stored is None:
        raise not_found(response_id, "response_id")
    return JSONResponse(stored.body)


async def delete_response(ctx: ServingContext, raw: Request) -> Response:
    response_id = raw.path_params["response_id"]
    if not ctx.responses.delete(response_id):
        raise not_found(response_id, "response_id")
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def _events(
    turn: _Turn, prompt: PreparedPrompt, params: SamplingParams, plan: ToolPlan
) -> AsyncIterator[dict[str, Any]]:
    items = OutputItems()
    started = turn.envelope("in_progress", [], None)
    yield items.event("response.created", response=started)
    yield items.event("response.in_progress", response=started)
    tracker = DeltaTracker()
    tool_calls = StreamedToolCalls(plan)
    final: RequestOutput | None = None
    async with aclosing(turn.ctx.generate(turn.id, [prompt], params)) as outputs:
        async for _, output in outputs:
            if output.finished:
                final = output
            for sample in output.outputs:
                delta = tracker.update(sample)
                content, calls, _ = tool_calls.delta(sample, delta.text, delta.finish_reason)
                for event in items.reasoning(delta.reasoning_content):
                    yield event
                for event in items.content(content):
                    yield event
                for call in calls:
                    for event in items.call(call):
                        yield event
    sample = final.outputs[0] if final is not None else None
    if final is None or sample is None or sample.finish_reason == "abort":
        for event in items.finish("incomplete"):
            yield event
        failed = turn.envelope("failed", items.items, None)
        failed["error"] = {"code": "server_error", "message": _ABORTED}
        yield items.event("response.failed", response=failed)
        return
    cut = sample.finish_reason == "length"
    for event in items.finish("incomplete" if cut else "completed"):
        yield event
    body = turn.finished(items, final, sample)
    yield items.event("response.incomplete" if cut else "response.completed", response=body)


async def _guarded(events: AsyncIterator[dict[str, Any]], metrics: ServerMetrics) -> AsyncIterator[str]:
    """`events` as server-sent events; a failure mid-stream ends it with an `error` event, which
    carries the error contract's body too (the `openai` client raises it as an APIError)."""
    sequence = 0
    try:
        async with aclosing(events) as iterator:
            async for event in iterator:
                sequence = event["sequence_number"] + 1
                yield _sse(event)
    except Exception as exc:
        error = as_openai_error(exc)
        metrics.count_error(error.kind)
        logger.warning("response stream failed: %s", error.message)
        body = error.body()
        yield _sse({"type": "error", **body["error"], "sequence_number": sequence, "error": body["error"]})
