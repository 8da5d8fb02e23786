"""`POST /v1/completions`: prompts (text, lists of text, token ids) completed by the engine.

With a reasoning parser (`--reasoning-parser`) a choice carries `reasoning_content` beside
`text`, as FastDeploy's completions do (and as `LLM.generate` returns it): the parser has taken
the reasoning out of `text`, so without the field it would be lost.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.errors import invalid_request
from fastdeploy.entrypoints.openai.logprobs import completion_logprobs, echoed_logprobs, prompt_logprobs_field
from fastdeploy.entrypoints.openai.params import completion_sampling_params, reject_unsupported
from fastdeploy.entrypoints.openai.protocol import CompletionRequest
from fastdeploy.entrypoints.openai.request_limits import check_request_limits
from fastdeploy.entrypoints.openai.serving import (
    ClientDisconnected,
    PreparedPrompt,
    ServingContext,
    new_id,
    output_usage,
    parse_body,
    refuse_aborted,
    request_prompt_items,
    sse,
    sse_stream,
    unless_disconnected,
    usage,
)
from fastdeploy.entrypoints.openai.structured_outputs import check_request_guided_decoding
from fastdeploy.entrypoints.streaming import DeltaTracker
from fastdeploy.errors import InvalidArgumentError, PromptTooLongError
from fastdeploy.input.prompts import PromptItem


def prepare_prompts(ctx: ServingContext, items: list[PromptItem]) -> list[PreparedPrompt]:
    """`items` as token ids, each checked against the context length; a prompt dict's
    `multimodal_data` goes through the model's processor as `LLM.generate` sends it (a text-only
    model refuses it, naming `prompt`)."""
    prepared = []
    for item in items:
        try:
            if item.token_ids is None and item.text:
                ctx.inputs.check_text_fits(item.text)
            token_ids, multimodal = ctx.inputs.prompt_inputs(item)
        except PromptTooLongError as exc:
            raise invalid_request(str(exc), param="prompt", code="context_length_exceeded") from exc
        except InvalidArgumentError as exc:
            raise invalid_request(str(exc), param="prompt") from exc
        ctx.check_prompt(token_ids, "prompt")
        text = (
            item.text if item.text is not None else ctx.tokenizer.decode(token_ids, skip_special_tokens=False)
        )
        prepared.append(PreparedPrompt(token_ids, text, multimodal=multimodal))
    return prepared


async def create_completion(ctx: ServingContext, raw: Request) -> Response:
    request = parse_body(CompletionRequest, await raw.body())
    model = ctx.model_name(request.model)
    reject_unsupported(request)
    check_request_limits(request)
    params = completion_sampling_params(request, ctx.generation_defaults)
    ctx.check_params(params)
    items = request_prompt_items(request.prompt, "prompt")
    # a full queue refuses every prompt of the request before any CPU is spent on them
    ctx.admit(len(items))
    await check_request_guided_decoding(ctx.engine.engine.guided, request, params)
    for item in items:  # media URLs fetched here, not on the preprocessing threads
        try:
            item.media = await ctx.inputs.fetch_media_urls(item.media)
        except InvalidArgumentError as exc:
            raise invalid_request(str(exc), param="prompt") from exc
    prompts = await ctx.offload(prepare_prompts, ctx, items)
    if "max_tokens" in request.model_fields_set:  # the default (16) is cut to what fits
        for prompt in prompts:
            ctx.check_max_tokens(len(prompt.token_ids), params.max_tokens, "max_tokens", "prompt")
    request_id = new_id("cmpl")
    created = int(time.time())
    ctx.admit(len(prompts))  # again: the queue may have filled while they were tokenized
    kv_target = ctx.kv_target(request.kv_transfer_params, request.stream)
    if request.stream:
        events = _events(ctx, request, prompts, params, request_id, model, created)
        return StreamingResponse(sse_stream(events, ctx.metrics), media_type="text/event-stream")
    try:
        outputs, transfer = await unless_disconnected(
            ctx.prefilled(request_id, prompts, params, kv_target, ctx.adapter(model)), raw
        )
    except ClientDisconnected:
        return Response(status_code=499)
    refuse_aborted(outputs)
    choices = []
    for prompt_index, output in enumerate(outputs):
        for sample in output.outputs:
            text = sample.text
            if request.echo:
                text = prompts[prompt_index].text + text
            logprobs = None
            if request.logprobs is not None:
                logprobs = completion_logprobs(
                    ctx.tokenizer, sample.token_ids, sample.logprobs or [], len(text) - len(sample.text)
                )
                if request.echo:
                    logprobs = _echoed(ctx, request, output, logprobs)
            choice = {
                "index": prompt_index * params.n + sample.index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": sample.finish_reason,
            }
            if sample.reasoning_content is not None:
                choice["reasoning_content"] = sample.reasoning_content
            if request.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_field(
                    ctx.tokenizer, output.prompt_logprobs or [], request.prompt_logprobs
                )
            choices.append(choice)
    body = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": output_usage(outputs),
    }
    if transfer is not None:
        body["kv_transfer_params"] = transfer
    return JSONResponse(body)


async def _events(
    ctx: ServingContext,
    request: CompletionRequest,
    prompts: list[PreparedPrompt],
    params: SamplingParams,
    request_id: str,
    model: str,
    created: int,
) -> AsyncIterator[str]:
    options = request.stream_options
    include_usage = bool(options and options.include_usage)
    continuous_usage = bool(options and options.continuous_usage_stats)
    trackers = [DeltaTracker() for _ in prompts]
    sent_chars: dict[int, int] = {}
    finals: dict[int, RequestOutput] = {}
    prompt_tokens = sum(len(prompt.token_ids) for prompt in prompts)
    generated: dict[tuple[int, int], int] = {}
    async for prompt_index, output in ctx.generate(request_id, prompts, params, ctx.adapter(model)):
        if output.finished:
            finals[prompt_index] = output
        for sample in output.outputs:
            delta = trackers[prompt_index].update(sample)
            generated[prompt_index, sample.index] = len(sample.token_ids)
            index = prompt_index * params.n + sample.index
            text = delta.text
            echo_now = request.echo and index not in sent_chars
            if echo_now:
                text = prompts[prompt_index].text + text
            wants_tokens = request.logprobs is not None and delta.token_ids
            if not (text or delta.reasoning_content or delta.finish_reason or wants_tokens):
                continue
            logprobs = None
            if request.logprobs is not None:
                logprobs = completion_logprobs(
                    ctx.tokenizer,
                    delta.token_ids,
                    delta.logprobs or [],
                    len(text) - len(delta.text) + sent_chars.get(index, 0),
                )
                if echo_now:
                    logprobs = _echoed(ctx, request, output, logprobs)
            sent_chars[index] = sent_chars.get(index, 0) + len(text)
            choice = {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": delta.finish_reason,
            }
            if delta.reasoning_content:
                choice["reasoning_content"] = delta.reasoning_content
            chunk: dict[str, Any] = {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
            }
            if include_usage:
                chunk["usage"] = usage(prompt_tokens, sum(generated.values())) if continuous_usage else None
            yield sse(chunk)
    if include_usage:
        final_usage = output_usage([finals[i] for i in sorted(finals)])
        yield sse(
            {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [],
                "usage": final_usage,
            }
        )


def _echoed(
    ctx: ServingContext, request: CompletionRequest, output: RequestOutput, generated: dict[str, Any]
) -> dict[str, Any]:
    """`generated` logprobs preceded by the prompt's, for `echo` with `logprobs`."""
    return echoed_logprobs(
        ctx.tokenizer, output.prompt_token_ids, output.prompt_logprobs or [], request.logprobs or 0, generated
    )
