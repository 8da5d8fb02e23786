"""Request bodies of the OpenAI-compatible API (pydantic), with vLLM's and FastDeploy's extensions.

Unknown fields are ignored, as OpenAI's API does. Fields we know but cannot honour yet (logit
bias, ...) are declared here so that
`params.reject_unsupported` can answer 400 naming them, never ignore them silently.
Prompt and message contents are kept loosely typed: the shared prompt normaliser and the chat
template layer validate them and name what is wrong.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _not_a_bool(value: Any) -> Any:
    """Refuse true/false where a number goes: pydantic's lax mode would read `true` as 1, a
    request that means something else than it says (OpenAI answers 400 too). Strings of digits
    stay accepted, as lax clients send them."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
    return value


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False
    #: vLLM's extension: usage in every chunk
    continuous_usage_stats: bool = False


class SamplingRequest(OpenAIBaseModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    #: prefill/decode disaggregation (set by `fastdeploy router`): {"decode_address": "host:port"}
    #: sends the prompt's KV blocks to that decode instance (prefill instances only)
    kv_transfer_params: dict[str, Any] | None = None
    #: vLLM's extension: per prompt token, this many most likely alternatives (not with stream)
    prompt_logprobs: int | None = None
    #: vLLM's beam search and best-of fields (docs/decoding.md)
    use_beam_search: bool = False
    best_of: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    # --- structured outputs (see structured_outputs.py) --------------------------------------
    response_format: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structural_tag: Any = None
    guided_whitespace_pattern: str | None = None
    #: vLLM's newer form: {"json" | "regex" | "choice" | "grammar" | "json_object" | "structural_tag": ...}
    structured_outputs: Any = None
    # --- understood, not supported yet (400 when used) --------------------------------------
    logit_bias: dict[str, float] | None = None

    _numbers = field_validator(
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "n",
        "seed",
        "min_tokens",
        "prompt_logprobs",
        "best_of",
        "length_penalty",
        mode="before",
    )(_not_a_bool)


class CompletionRequest(SamplingRequest):
    """`POST /v1/completions`."""

    #: str, list of str, token ids, or list of token-id lists
    prompt: Any = None
    max_tokens: int | None = 16
    echo: bool = False
    #: number of most likely tokens to return per position (0..20)
    logprobs: int | None = None
    suffix: str | None = None

    _logprobs_number = field_validator("logprobs", mode="before")(_not_a_bool)


class ChatCompletionRequest(SamplingRequest):
    """`POST /v1/chat/completions`."""

    messages: list[Any] = Field(default_factory=list)
    #: per-request multimodal processor settings (pixel bounds, frame sampling)
    mm_processor_kwargs: dict[str, Any] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    reasoning_max_tokens: int | None = None
    tools: Any = None
    #: "none", "auto", "required" or {"type": "function", "function": {"name": ...}}
    tool_choice: Any = None
    #: accepted; the parsers return every call the model writes
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None

    _chat_numbers = field_validator(
        "max_completion_tokens", "top_logprobs", "reasoning_max_tokens", mode="before"
    )(_not_a_bool)
