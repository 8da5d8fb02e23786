"""What completions and chat completions share: the served model, prompt checks, running prompts
through the engine, server-sent events, usage, and turning failures into OpenAI errors.

A request with several prompts (completions accept a list) becomes one engine request per
prompt; their outputs are merged into one stream of `(prompt_index, RequestOutput)`. Leaving
that stream early (the client disconnected) cancels every engine request behind it, which frees
their KV blocks.

Chat-template rendering and tokenization run on a small thread pool (`ServingContext.offload`),
never on the event loop: a multi-megabyte prompt takes seconds to tokenize, and meanwhile every
other connection, `/health` included, must still be answered.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel, ValidationError

from fastdeploy.client_disconnects import ClientDisconnected as ClientDisconnected
from fastdeploy.client_disconnects import unless_disconnected as unless_disconnected
from fastdeploy.engine.async_engine import (
    AsyncLLMEngine,
    EngineOverloadedError,
    EngineStoppedError,
    GenerationError,
)
from fastdeploy.engine.request import OK, RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.disaggregation import Disaggregation
from fastdeploy.entrypoints.openai.errors import OpenAIError, from_sampling_error, invalid_request
from fastdeploy.entrypoints.openai.metrics import ServerMetrics
from fastdeploy.entrypoints.openai.responses_store import DEFAULT_RESPONSES_STORE_SIZE, ResponseStore
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.processor import InputProcessor
from fastdeploy.input.prompts import PromptItem, normalize_prompts
from fastdeploy.logger import get_logger

logger = get_logger(__name__)

Model = TypeVar("Model", bound=BaseModel)
T = TypeVar("T")
P = ParamSpec("P")

#: the last event of every stream
SSE_DONE = "data: [DONE]\n\n"
#: threads that render chat templates and tokenize prompts (the tokenizers release the GIL)
PREPROCESS_THREADS = 2
#: `Retry-After` seconds sent with a 503 (overloaded or shutting down)
RETRY_AFTER_SECONDS = 1


@dataclass
class PreparedPrompt:
    """A prompt ready for the engine."""

    token_ids: list[int]
    #: the prompt's text (decoded from the ids if it came as ids), for `echo`
    text: str
    thinking_enabled: bool = True
    #: processed images and videos (`MultiModalPrompt`) of a chat request with media parts
    multimodal: Any = None


class ServingContext:
    """The engine and settings every endpoint uses."""

    def __init__(
        self,
        engine: AsyncLLMEngine,
        served_model_names: list[str],
        metrics: ServerMetrics,
        api_key: str | None = None,
        model_root: str | None = None,
        metrics_require_api_key: bool = False,
        trust_request_chat_template: bool = False,
        adapters: Any = None,
        responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE,
    ) -> None:
        if not served_model_names:
            raise InvalidArgumentError("served_model_names must name at least one model")
        self.engine = engine
        #: prompts, chat templates and media become engine inputs here (one processor serves
        #: every replica: they load the same model)
        self.inputs: InputProcessor = engine.engine.input_processor
        self.tokenizer = self.inputs.tokenizer
        self.max_model_len = self.inputs.max_model_len
        #: the model's sampling settings (generation_config.json) for fields a request omits
        self.generation_defaults = engine.engine.generation_defaults
        #: "generate" (completions, chat) or "pooling" (embeddings): which endpoints this server serves
        self.runner: str = engine.engine.config.runner
        self.served_model_names = list(served_model_names)
        self.metrics = metrics
        self.api_key = api_key
        self.model_root = model_root
        self.metrics_require_api_key = metrics_require_api_key
        #: render a request's own `chat_template` (`--trust-request-chat-template`)
        self.trust_request_chat_template = trust_request_chat_template
        #: the Responses API's stored responses (`--responses-store-size`)
        self.responses = ResponseStore(responses_store_size)
        self._preprocess = ThreadPoolExecutor(PREPROCESS_THREADS, thread_name_prefix="fastdeploy-preprocess")
        #: the LoRA adapters served by name (`serving_lora.ServedAdapters`), None without
        self.adapters = adapters
        #: prefill/decode disaggregation (`--splitwise-role prefill|decode`), else None
        self.disagg: Disaggregation | None = None

    async def offload(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`function(*args, **kwargs)` on the preprocessing threads (CPU work off the event loop)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._preprocess, functools.partial(function, *args, **kwargs))

    def close(self) -> None:
        """Stop the preprocessing threads (after the server has drained)."""
        self._preprocess.shutdown(wait=False, cancel_futures=True)
        if self.disagg is not None:
            self.disagg.close()

    def model_name(self, requested: str | None) -> str:
        """The name to answer with; 404 if the request names a model this server does not serve."""
        if requested is None:
            return self.served_model_names[0]
        if requested not in self.served_model_names and self.adapter(requested) is None:
            served = ", ".join(self.served_model_names)
            if self.adapters is not None and self.adapters.enabled:
                served += f"; LoRA adapters: {', '.join(self.adapters.names()) or 'none'}"
            raise OpenAIError(
                404,
                f"The model `{requested}` does not exist; this server serves: {served}",
                param="model",
                code="model_not_found",
            )
        return requested

    def adapter(self, model: str) -> Any:
        """The LoRA adapter (`LoRARequest`) a request's `model` names, None for the base model."""
        return self.adapters.get(model) if self.adapters is not None else None

    def check_prompt(self, token_ids: list[int], param: str) -> None:
        """400 if the engine cannot serve these prompt tokens (too long, empty, bad ids)."""
        if len(token_ids) >= self.max_model_len:
            raise invalid_request(
                f"This model's maximum context length is {self.max_model_len} tokens, but the request "
                f"has {len(token_ids)} tokens of {param}, leaving no room to generate; shorten the {param} "
                "(or start the server with a larger --max-model-len)",
                param=param,
                code="context_length_exceeded",
            )
        try:
            self.inputs.validate(token_ids)
        except InvalidArgumentError as exc:
            raise invalid_request(str(exc), param=param) from exc

    def check_max_tokens(
        self, prompt_tokens: int, max_tokens: int | None, param: str, prompt_param: str
    ) -> None:
        """400 naming the maximum when a requested `max_tokens` does not fit after the prompt.

        OpenAI and vLLM refuse such a request rather than silently generating less; a default
        (None) is not checked: the engine then stops at the context window.
        """
        if max_tokens is None:
            return
        room = self.max_model_len - prompt_tokens
        if max_tokens > room:
            raise invalid_request(
                f"{param}={max_tokens} is too large: this model's maximum context length is "
                f"{self.max_model_len} tokens and {prompt_tokens} of them are {prompt_param}, so at most "
                f"{room} tokens can be generated; lower {param} or shorten the {prompt_param}",
                param=param,
                code="context_length_exceeded",
            )

    def check_params(self, params: SamplingParams, renames: dict[str, str] | None = None) -> None:
        """400 naming the request field if the engine's limits (e.g. --max-logprobs) rule out `params`."""
        try:
            self.engine.engine.validate_params(params)
        except InvalidArgumentError as exc:
            raise from_sampling_error(exc, renames) from exc

    def admit(self, count: int) -> None:
        """Raise 503 now, before a stream starts, if `count` more requests do not fit; 400 naming
        `prompt` if that many could never fit."""
        try:
            self.engine.check_capacity(count)
        except (EngineOverloadedError, EngineStoppedError) as exc:
            raise as_openai_error(exc) from exc
        except InvalidArgumentError as exc:
            raise invalid_request(str(exc), param="prompt") from exc

    async def generate(
        self, request_id: str, prompts: list[PreparedPrompt], params: SamplingParams, lora: Any = None
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Outputs of all `prompts` as they come, tagged with the prompt's index (`lora`: the
        LoRA adapter they run with)."""
        for _ in prompts:
            self.metrics.count_request()
        if len(prompts) == 1:
            prompt = prompts[0]
            async with aclosing(
                self._one(prompt_request_ids(request_id, 1)[0], prompt, params, lora)
            ) as outputs:
                async for output in outputs:
                    yield 0, output
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

        async def pump(index: int, prompt: PreparedPrompt) -> None:
            try:
                async with aclosing(self._one(ids[index], prompt, params, lora)) as outputs:
                    async for output in outputs:
                        queue.put_nowait((index, output))
            except Exception as exc:
                queue.put_nowait((index, exc))
            finally:
                queue.put_nowait((index, None))

        ids = prompt_request_ids(request_id, len(prompts))
        tasks = [asyncio.create_task(pump(index, prompt)) for index, prompt in enumerate(prompts)]
        try:
            remaining = len(tasks)
            while remaining:
                index, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _one(
        self, request_id: str, prompt: PreparedPrompt, params: SamplingParams, lora: Any = None
    ) -> AsyncIterator[RequestOutput]:
        return self.engine.generate(
            request_id,
            prompt.token_ids,
            params,
            prompt=prompt.text,
            thinking_enabled=prompt.thinking_enabled,
            multimodal=prompt.multimodal,
            lora_request=lora,
        )

    async def final_outputs(
        self, request_id: str, prompts: list[PreparedPrompt], params: SamplingParams, lora: Any = None
    ) -> list[RequestOutput]:
        """The finished output of each prompt, in prompt order."""
        finals: dict[int, RequestOutput] = {}
        async with aclosing(self.generate(request_id, prompts, params, lora)) as outputs:
            async for index, output in outputs:
                finals[index] = output
        return [finals[index] for index in range(len(prompts))]

    def kv_target(self, params: Any, stream: bool) -> str | None:
        """Where a prefill request's KV blocks go (its `kv_transfer_params`), else None."""
        if params is None:
            return None
        if self.disagg is None:
            raise invalid_request(
                "kv_transfer_params are for prefill instances (fastdeploy serve --splitwise-role prefill)",
                param="kv_transfer_params",
            )
        return self.disagg.target(params, stream)

    async def prefilled(
        self,
        request_id: str,
        prompts: list[PreparedPrompt],
        params: SamplingParams,
        kv_target: str | None,
        lora: Any = None,
    ) -> tuple[list[RequestOutput], dict[str, int] | None]:
        """`final_outputs`, and with a `kv_target` the prompts' KV blocks sent there before the
        answer (the summed transfer results; 504 if a transfer failed)."""
        if kv_target is None or self.disagg is None:
            return await self.final_outputs(request_id, prompts, params, lora), None
        ids = prompt_request_ids(request_id, len(prompts))
        transfers = self.disagg.expect(ids, kv_target)
        try:
            outputs = await self.final_outputs(request_id, prompts, params, lora)
        finally:
            self.disagg.forget(ids)  # those whose request never reached its prompt's end
        if any(output.error_code != OK for output in outputs):
            return outputs, None
        return outputs, await self.disagg.outcome(transfers)


def request_prompt_items(value: Any, param: str) -> list[PromptItem]:
    """A request's prompts (texts or token ids) through the normaliser `LLM.generate` uses, each
    fault a 400 naming `param` (no tokenizing yet: their number is checked against the queue
    first)."""
    if value is None:
        raise invalid_request(f"{param} is required", param=param)
    try:
        items = normalize_prompts(value)
    except InvalidArgumentError as exc:
        raise invalid_request(str(exc), param=param) from exc
    if not items:
        raise invalid_request(f"{param} must not be an empty list", param=param)
    for item in items:
        if item.error is not None:
            raise invalid_request(item.error, param=param)
    return items


def prompt_request_ids(request_id: str, count: int) -> list[str]:
    """The engine's request id of each prompt of a request."""
    return [request_id] if count == 1 else [f"{request_id}-{index}" for index in range(count)]


def refuse_aborted(outputs: list[RequestOutput]) -> None:
    """503 for a non-streaming request the server aborted (at its shutdown deadline).

    A stream shows such an end as `finish_reason: "abort"`; a whole response would otherwise
    look like a normal, merely short, answer.
    """
    if any(sample.finish_reason == "abort" for output in outputs for sample in output.outputs):
        raise OpenAIError(
            503,
            "the server stopped this request before it finished (it is shutting down); retry it",
            code="server_shutting_down",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def parse_body(model: type[Model], body: bytes) -> Model:
    """The request body as `model`; 400 naming the field (or the JSON error) otherwise."""
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first.get("loc", ()))
        if first.get("type") == "json_invalid":
            raise invalid_request(f"the request body is not valid JSON: {first.get('msg')}") from exc
        if not location:
            raise invalid_request(f"the request body must be a JSON object: {first.get('msg')}") from exc
        raise invalid_request(f"{location}: {first.get('msg')}", param=location.split(".")[0]) from exc


def as_openai_error(exc: BaseException) -> OpenAIError:
    """The HTTP error for a failure while serving a request."""
    if isinstance(exc, OpenAIError):
        return exc
    retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if isinstance(exc, EngineOverloadedError):
        return OpenAIError(503, str(exc), code="server_overloaded", headers=retry)
    if isinstance(exc, EngineStoppedError):
        return OpenAIError(503, str(exc), code="server_shutting_down", headers=retry)
    if isinstance(exc, InvalidArgumentError):
        return invalid_request(str(exc))
    if isinstance(exc, GenerationError):
        return OpenAIError(exc.code if exc.code >= 400 else 500, str(exc), code=exc.kind)
    logger.error("unexpected error while serving a request", exc_info=exc)
    return OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying `payload` as JSON."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def output_usage(outputs: list[RequestOutput]) -> dict[str, int]:
    """Usage of finished outputs: each prompt counted once, every sample's tokens counted."""
    prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    completion_tokens = sum(len(sample.token_ids) for output in outputs for sample in output.outputs)
    return usage(prompt_tokens, completion_tokens)


async def sse_stream(events: AsyncIterator[str], metrics: ServerMetrics) -> AsyncIterator[str]:
    """`events`, then `[DONE]`; a failure mid-stream becomes an error event (the status is sent)."""
    try:
        async with aclosing(events) as iterator:
            async for event in iterator:
                yield event
    except Exception as exc:
        error = as_openai_error(exc)
        metrics.count_error(error.kind)
        logger.warning("stream failed: %s", error.message)
        yield sse(error.body())
    yield SSE_DONE
