"""From an OpenAI request to `SamplingParams`, refusing what we cannot do with a 400 that says so."""

from __future__ import annotations

from typing import Any

from fastdeploy.engine.sampling_params import BEAM_SEARCH_FIXED_FIELDS, SamplingParams
from fastdeploy.entrypoints.openai.errors import from_sampling_error, invalid_request, unsupported
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from fastdeploy.entrypoints.openai.structured_outputs import guided_decoding
from fastdeploy.errors import InvalidArgumentError

#: request fields passed to SamplingParams under the same name when set
_PASS_THROUGH = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "n",
    "seed",
    "ignore_eos",
    "min_tokens",
    "bad_words",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "best_of",
    "use_beam_search",
    "length_penalty",
    "early_stopping",
)

#: SamplingParams fields that chat requests name differently
CHAT_RENAMES = {"logprobs": "top_logprobs"}


def reject_unsupported(request: SamplingRequest) -> None:
    """Raise a 400 for every parameter we understand but do not implement yet."""
    if request.stream and request.use_beam_search:
        raise invalid_request(
            "use_beam_search cannot be streamed: beams are ranked when the search ends; set stream to false",
            param="use_beam_search",
        )
    if request.stream and request.best_of is not None and request.best_of > request.n:
        raise invalid_request(
            "best_of > n cannot be streamed: the best samples are known only at the end; set stream to false",
            param="best_of",
        )
    if request.logit_bias:
        raise unsupported("logit_bias", "logit biasing")
    if request.prompt_logprobs is not None and request.stream:
        raise invalid_request(
            "prompt_logprobs cannot be streamed; set stream to false (or use echo with logprobs)",
            param="prompt_logprobs",
        )
    if request.stream_options is not None and not request.stream:
        raise invalid_request("stream_options is only allowed when stream is true", param="stream_options")
    if isinstance(request, CompletionRequest) and request.suffix:
        raise unsupported("suffix", "insertion (text after the completion)")
    if (
        isinstance(request, ChatCompletionRequest)
        and request.top_logprobs is not None
        and not request.logprobs
    ):
        raise invalid_request("top_logprobs needs logprobs to be true", param="top_logprobs")


def completion_sampling_params(request: CompletionRequest, defaults: dict[str, Any]) -> SamplingParams:
    """`defaults`: the model's settings (generation_config.json) for the fields the request omits."""
    max_tokens = request.max_tokens
    if "max_tokens" not in request.model_fields_set:  # OpenAI's default 16 yields to the model's
        max_tokens = defaults.get("max_tokens", max_tokens)
    extra: dict[str, Any] = {"guided_decoding": guided_decoding(request)}
    # echo with logprobs returns the prompt's logprobs too, with as many alternatives per token
    counts = [request.prompt_logprobs, request.logprobs if request.echo else None]
    if any(count is not None for count in counts):
        extra["prompt_logprobs"] = max(count for count in counts if count is not None)
    return _build(request, max_tokens, request.logprobs, {}, defaults, **extra)


def chat_sampling_params(request: ChatCompletionRequest, defaults: dict[str, Any]) -> SamplingParams:
    """`defaults`: the model's settings (generation_config.json) for the fields the request omits."""
    if request.max_completion_tokens is not None:
        max_tokens, max_name = request.max_completion_tokens, "max_completion_tokens"
    else:
        max_tokens = request.max_tokens if request.max_tokens is not None else defaults.get("max_tokens")
        max_name = "max_tokens"
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    renames = {"max_tokens": max_name, **CHAT_RENAMES}
    extra: dict[str, Any] = {"guided_decoding": guided_decoding(request)}
    if request.reasoning_max_tokens is not None:
        extra["reasoning_max_tokens"] = request.reasoning_max_tokens
    if request.prompt_logprobs is not None:
        extra["prompt_logprobs"] = request.prompt_logprobs
    return _build(request, max_tokens, logprobs, renames, defaults, **extra)


def _build(
    request: SamplingRequest,
    max_tokens: int | None,
    logprobs: int | None,
    renames: dict[str, str],
    defaults: dict[str, Any],
    **extra: Any,
) -> SamplingParams:
    if request.use_beam_search:  # a search ranks every token: the model's sampling settings stay out
        defaults = {name: value for name, value in defaults.items() if name not in BEAM_SEARCH_FIXED_FIELDS}
    kwargs: dict[str, Any] = dict(defaults)
    kwargs.update(
        (name, getattr(request, name)) for name in _PASS_THROUGH if getattr(request, name) is not None
    )
    kwargs.update(max_tokens=max_tokens, logprobs=logprobs, **extra)
    try:
        return SamplingParams(**kwargs)
    except InvalidArgumentError as exc:
        raise from_sampling_error(exc, renames) from exc
