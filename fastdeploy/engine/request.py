"""The public result types of a request, with exactly the fields FastDeploy documents.

`RequestOutput.outputs` is one `CompletionOutput`, as in FastDeploy (`output.outputs.text`);
it also indexes and iterates like vLLM's list (`output.outputs[0].text`), and with `n > 1` the
other samples are `output.outputs[1]`, `output.outputs[2]`, ...
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

#: error_code values; 200 means success, as in FastDeploy's responses.
OK = 200
INVALID_REQUEST = 400
INTERNAL_ERROR = 500


@dataclass
class RequestMetrics:
    """Timings of one request, in seconds; `arrival_time` and `inference_start_time` are epoch times."""

    arrival_time: float
    inference_start_time: float | None = None
    #: latency from arrival to the first generated token
    first_token_time: float | None = None
    #: time spent waiting before the first forward pass that included the request
    time_in_queue: float | None = None
    #: sum of the forward passes the request took part in
    model_forward_time: float = 0.0
    #: from arrival (before tokenisation) to the last token, preprocessing and queueing included
    model_execute_time: float = 0.0
    #: speculative decoding: passes that verified drafts, drafts proposed, drafts accepted
    spec_num_verify_steps: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Accepted drafts over proposed drafts (None without drafts)."""
        return (
            self.spec_num_accepted_tokens / self.spec_num_draft_tokens if self.spec_num_draft_tokens else None
        )

    @property
    def spec_accepted_tokens_per_step(self) -> float | None:
        """Drafts accepted per verify pass (each pass also adds one token of its own)."""
        return (
            self.spec_num_accepted_tokens / self.spec_num_verify_steps if self.spec_num_verify_steps else None
        )


@dataclass
class CompletionOutput:
    """One generated sample."""

    index: int
    send_idx: int
    token_ids: list[int]
    text: str
    reasoning_content: str | None = None
    #: "stop" (EOS, stop token or stop string), "length" (max_tokens / max_model_len), "abort", or None
    finish_reason: str | None = None
    #: per generated token, {token_id: logprob} of the top `SamplingParams.logprobs` (and the chosen) tokens
    logprobs: list[dict[int, float]] | None = None
    #: tool calls the reasoning parser found in the answer (ERNIE-X1's `<tool_call>` blocks):
    #: OpenAI-style dicts {"id", "type": "function", "function": {"name", "arguments"}}
    tool_calls: list[dict] | None = None
    #: sum of the logprobs of `token_ids` (beam search, best_of, or when `logprobs` is set)
    cumulative_logprob: float | None = None
    _samples: list[CompletionOutput] = field(default_factory=list, repr=False, compare=False)

    @property
    def resoning_content(self) -> str | None:
        """`reasoning_content` under the spelling of FastDeploy's Chinese offline-inference docs'
        ERNIE-X1 example (`output.outputs.resoning_content`), so that code runs as written."""
        return self.reasoning_content

    def _all(self) -> list[CompletionOutput]:
        return self._samples or [self]

    def __getitem__(self, index: int) -> CompletionOutput:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[CompletionOutput]:
        return iter(self._all())


@dataclass
class RequestOutput:
    """The result (or, while streaming, the progress) of one prompt."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: CompletionOutput
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    num_input_image_tokens: int = 0
    num_input_video_tokens: int = 0
    error_code: int = OK
    error_msg: str | None = None
    #: with `SamplingParams.prompt_logprobs=k`: per prompt token, {token_id: logprob} of the k most
    #: likely tokens and the prompt's own token; None for the first token (vLLM's field)
    prompt_logprobs: list[dict[int, float] | None] | None = None
