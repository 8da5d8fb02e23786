"""The engine's state of a request (`EngineRequest`) and of each sample being generated
(`Sequence`: its tokens, KV blocks, random state, timings and stop state).

Decoding features keep their own state, keyed by sequence or request (`engine/step_feature.py`):
speculative drafts, prompt logprobs, beams, grammars and fault records are not on the sequence.
What a feature adds to one pass (drafts to verify, prompt positions to score) travels in the batch
(`ScheduledBatch`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Engine-side state of one sample of one request (a request with `n=k` has k sequences).

    Compared by identity: the scheduler finds sequences in its queues with `in` and `remove`,
    which would otherwise compare every field of every other sequence.
    """

    seq_id: int
    request_id: str
    sample_index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    #: generation stops with finish_reason "length" when the output reaches this many tokens
    max_output_tokens: int
    rng: np.random.Generator
    arrival_time: float
    detokenizer: Any = None
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    #: leading blocks of `block_table` already registered in the prefix cache
    num_registered_blocks: int = 0
    #: prompt tokens served from the prefix cache when the sequence was first scheduled
    num_cached_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    text: str = ""
    logprobs: list[dict[int, float]] | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    forward_time: float = 0.0
    num_preemptions: int = 0
    #: nobody reads the text before the sequence finishes (no streaming, no stop strings): the
    #: detokenizer then turns all outputs into text in one call when it is read, not every step
    defer_text: bool = False
    #: what the model needs beyond token ids (a multimodal prompt), shared by a request's samples;
    #: opaque to the engine except for `block_key(start, end)`, mixed into prefix-cache keys
    extra_inputs: Any = None
    #: sum of the chosen tokens' logprobs, when tracked (best_of ranks samples by it)
    cumulative_logprob: float | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


@dataclass
class EngineRequest:
    """A request inside the engine: its prompt, its samples and their shared settings."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    seqs: list[Sequence] = field(default_factory=list)
    bad_words_ids: list[list[int]] = field(default_factory=list)
    #: emit an output after every step that adds tokens, not only when finished
    stream: bool = False
    #: False when the request turned thinking off (chat_template_kwargs enable_thinking=False)
    thinking_enabled: bool = True
    #: images and videos of the prompt (`MultiModalPrompt`), None for text-only requests
    multimodal: Any = None
    #: generated-token limit of each sample (max_tokens within max_model_len)
    max_output_tokens: int = 0

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)
