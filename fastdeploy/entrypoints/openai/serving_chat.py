"""`POST /v1/chat/completions`: a conversation rendered with the chat template, answered by the engine.

With a reasoning parser (`--reasoning-parser`), the engine splits each sample into
`reasoning_content` and `content`; both are sent, in the message and in stream deltas.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.chat_tools import (
    StreamedToolCalls,
    chat_message,
    constrain_for_tools,
    plan_chat_tools,
)
from fastdeploy.entrypoints.openai.errors import invalid_request
from fastdeploy.entrypoints.openai.logprobs import chat_logprobs, prompt_logprobs_field
from fastdeploy.entrypoints.openai.params import CHAT_RENAMES, chat_sampling_params, reject_unsupported
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest
from fastdeploy.entrypoints.openai.request_limits import check_request_limits
from fastdeploy.entrypoints.openai.serving import (
    ClientDisconnected,
    PreparedPrompt,
    ServingContext,
    new_id,
    output_usage,
    parse_body,
    refuse_aborted,
    sse,
    sse_stream,
    unless_disconnected,
    usage,
)
from fastdeploy.entrypoints.openai.structured_outputs import check_request_guided_decoding
from fastdeploy.entrypoints.streaming import DeltaTracker
from fastdeploy.errors import InvalidArgumentError, PromptTooLongError
from fastdeploy.input.conversation import with_tools
from fastdeploy.input.multimodal.parts import Media, extract_media
from fastdeploy.tool_calling.request import ToolPlan, parser_factory, template_messages


async def request_media(ctx: ServingContext, request: ChatCompletionRequest) -> Media:
    """The conversation's images and videos, their URLs already fetched (off the preprocessing
    threads, so a slow media host holds only this request)."""
    try:
        return await ctx.inputs.fetch_media_urls(extract_media(request.messages))
    except InvalidArgumentError as exc:
        raise invalid_request(str(exc), param="messages") from exc


def prepare_conversation(
    ctx: ServingContext, request: ChatCompletionRequest, plan: ToolPlan, media: Media, checked: bool = True
) -> PreparedPrompt:
    """The conversation rendered as `LLM.chat` renders it (same template, same encoding), with
    `media` (`request_media`) through the model's processor; `checked`: refused (400) unless
    the engine can serve it (False for `/tokenize`, which counts any length)."""
    if not request.messages:
        raise invalid_request("messages must be a non-empty list of messages", param="messages")
    try:
        item = ctx.inputs.render(
            template_messages(request.messages),
            chat_template=request.chat_template,
            add_generation_prompt=request.add_generation_prompt,
            template_kwargs=with_tools(request.chat_template_kwargs, plan.tools),
            check_length=checked,
        )
        token_ids, multimodal = ctx.inputs.chat_inputs(item, media, request.mm_processor_kwargs)
    except PromptTooLongError as exc:
        raise invalid_request(str(exc), param="messages", code="context_length_exceeded") from exc
    except InvalidArgumentError as exc:
        raise invalid_request(str(exc), param="messages") from exc
    if checked:
        ctx.check_prompt(token_ids, "messages")
    return PreparedPrompt(token_ids, item.text or "", item.thinking_enabled, multimodal)


def check_request_template(ctx: ServingContext, chat_template: str | None) -> None:
    """A 400 for a request's own chat template unless the server trusts them."""
    if chat_template is not None and not ctx.trust_request_chat_template:
        raise invalid_request(
            "this server does not render a chat_template sent in a request (start it with "
            "--trust-request-chat-template to allow it); leave the field out to use the model's template",
            param="chat_template",
        )


async def prepare_chat(
    ctx: ServingContext, request: ChatCompletionRequest
) -> tuple[ToolPlan, SamplingParams, PreparedPrompt]:
    """A chat request checked, its sampling parameters and grammar ready and its prompt rendered,
    admitted to the queue (503 when full): everything before generation, which the Responses
    API shares (`serving_responses` turns its requests into chat requests)."""
    reject_unsupported(request)
    check_request_limits(request)
    check_request_template(ctx, request.chat_template)
    engine = ctx.engine.engine
    plan = plan_chat_tools(parser_factory(engine.tool_parser_class, ctx.inputs.tokenizer), request)
    params = chat_sampling_params(request, ctx.generation_defaults)
    ctx.check_params(params, CHAT_RENAMES)
    ctx.admit(1)  # a full queue refuses before any CPU is spent on the prompt
    await check_request_guided_decoding(engine.guided, request, params)
    params = await constrain_for_tools(engine.guided, request, params, plan)
    media = await request_media(ctx, request)
    prompt = await ctx.offload(prepare_conversation, ctx, request, plan, media)
    max_param = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    ctx.check_max_tokens(len(prompt.token_ids), params.max_tokens, max_param, "messages")
    return plan, params, prompt


async def create_chat_completion(ctx: ServingContext, raw: Request) -> Response:
    request = parse_body(ChatCompletionRequest, await raw.body())
    model = ctx.model_name(request.model)
    plan, params, prompt = await prepare_chat(ctx, request)
    request_id = new_id("chatcmpl")
    created = int(time.time())
    kv_target = ctx.kv_target(request.kv_transfer_params, request.stream)
    if request.stream:
        ctx.admit(1)
        events = _events(ctx, request, prompt, params, plan, request_id, model, created)
        return StreamingResponse(sse_stream(events, ctx.metrics), media_type="text/event-stream")
    try:
        (output,), transfer = await unless_disconnected(
            ctx.prefilled(request_id, [prompt], params, kv_target, ctx.adapter(model)), raw
        )
    except ClientDisconnected:
        return Response(status_code=499)
    refuse_aborted([output])
    top = request.top_logprobs or 0
    choices = []
    for sample in output.outputs:
        logprobs = None
        if request.logprobs:
            logprobs = chat_logprobs(ctx.tokenizer, sample.token_ids, sample.logprobs or [], top)
        message, finish_reason = chat_message(plan, sample)
        choices.append(
            {
                "index": sample.index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        )
    body = {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": output_usage([output]),
    }
    if request.prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs_field(
            ctx.tokenizer, output.prompt_logprobs or [], request.prompt_logprobs
        )
    if transfer is not None:
        body["kv_transfer_params"] = transfer
    return JSONResponse(body)


async def _events(
    ctx: ServingContext,
    request: ChatCompletionRequest,
    prompt: PreparedPrompt,
    params: SamplingParams,
    plan: ToolPlan,
    request_id: str,
    model: str,
    created: int,
) -> AsyncIterator[str]:
    options = request.stream_options
    include_usage = bool(options and options.include_usage)
    continuous_usage = bool(options and options.continuous_usage_stats)
    prompt_tokens = len(prompt.token_ids)
    generated: dict[int, int] = {}

    def chunk(choice: dict[str, Any]) -> str:
        payload: dict[str, Any] = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if include_usage:
            payload["usage"] = usage(prompt_tokens, sum(generated.values())) if continuous_usage else None
        return sse(payload)

    for index in range(params.n):
        yield chunk(
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        )
    tracker = DeltaTracker()
    tool_calls = StreamedToolCalls(plan)
    final: RequestOutput | None = None
    top = request.top_logprobs or 0
    async for _, output in ctx.generate(request_id, [prompt], params, ctx.adapter(model)):
        if output.finished:
            final = output
        for sample in output.outputs:
            delta = tracker.update(sample)
            generated[sample.index] = len(sample.token_ids)
            content, calls, finish_reason = tool_calls.delta(sample, delta.text, delta.finish_reason)
            wants_tokens = request.logprobs and delta.token_ids
            if not (content or calls or delta.reasoning_content or finish_reason or wants_tokens):
                continue
            message: dict[str, Any] = {}
            if delta.reasoning_content:
                message["reasoning_content"] = delta.reasoning_content
            if content:
                message["content"] = content
            if calls:
                message["tool_calls"] = calls
            logprobs = None
            if request.logprobs:
                logprobs = chat_logprobs(ctx.tokenizer, delta.token_ids, delta.logprobs or [], top)
            yield chunk(
                {
                    "index": sample.index,
                    "delta": message,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason,
                }
            )
    if include_usage and final is not None:
        yield sse(
            {
                "id": request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": output_usage([final]),
            }
        )
