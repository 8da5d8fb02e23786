"""Which sampling settings each fast path of the step can take, and the engine's limits on them.

Every rule is written once here: the device sampler, async scheduling and speculative decoding
each combine these predicates instead of listing the settings again, and `check_engine_limits`
holds the checks that depend on the engine (not on the settings alone, which `SamplingParams`
checks itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.errors import InvalidArgumentError


def no_penalties(params: SamplingParams) -> bool:
    """No repetition / frequency / presence penalty: the next token does not depend on the counts
    of earlier ones."""
    return params.repetition_penalty == 1.0 and not params.frequency_penalty and not params.presence_penalty


def no_history_constraints(params: SamplingParams) -> bool:
    """No bad words, grammar or thinking budget: nothing the host derives from the tokens so far
    bans or forces the next one (`min_tokens` aside: it ends at a known length)."""
    return not params.bad_words and params.guided_decoding is None and params.reasoning_max_tokens is None


def greedy_without_extras(params: SamplingParams) -> bool:
    """Greedy rows that need nothing but the argmax (which the backend takes on the device)."""
    return params.greedy and no_penalties(params) and params.logprobs is None


def device_samplable(params: SamplingParams) -> bool:
    """Whether the backends' sampling kernel (temperature, top-k, top-p) covers these settings."""
    return (
        not params.greedy
        and no_penalties(params)
        and params.min_p == 0.0
        and params.logprobs is None
        and params.num_samples == params.n  # best_of ranks samples by their logprobs
    )


def samples_in_pass(params: SamplingParams, reasoning_budget_applies: bool) -> bool:
    """Whether a sequence's next token is known from its logits row alone, greedy or drawn with
    temperature / top-k / top-p: nothing the host does between passes (bans, grammar masks, beam
    choices, a forced end of thinking, prompt scoring, logprobs) can change it, so the pass may
    sample it on the device (captured decode steps)."""
    return (
        (greedy_without_extras(params) or device_samplable(params))
        and not params.min_tokens
        and not params.bad_words
        and params.guided_decoding is None
        and not params.use_beam_search
        and params.prompt_logprobs is None
        and not (reasoning_budget_applies and params.reasoning_max_tokens is not None)
    )


def overlappable(params: SamplingParams, reasoning_budget_applies: bool) -> bool:
    """Whether a sequence's next token is known once its argmax is (async scheduling): greedy, and
    sampled in the pass (`samples_in_pass`)."""
    return greedy_without_extras(params) and samples_in_pass(params, reasoning_budget_applies)


def speculation_allowed(params: SamplingParams) -> bool:
    """Whether drafts for these settings can be verified from one pass's logits: the sampling of
    each position must not depend on the tokens before it in ways the verify pass cannot see
    (`min_tokens`, which ends at a known length, is checked per sequence)."""
    return not params.use_beam_search and no_penalties(params) and no_history_constraints(params)


@dataclass(frozen=True)
class EngineLimits:
    """What one engine can serve, for `check_engine_limits`."""

    max_model_len: int
    vocab_size: int
    max_logprobs: int
    max_num_seqs: int
    device: str
    pipeline_parallel: bool
    copies_kv_blocks: bool


def check_engine_limits(params: SamplingParams, limits: EngineLimits) -> None:
    """Raise InvalidArgumentError if the engine's limits rule out `params`."""
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and value > limits.max_logprobs:
            raise InvalidArgumentError(
                f"SamplingParams.{name} must be in [0, {limits.max_logprobs}] (the engine's "
                f"max_logprobs), got {value}"
            )
    if params.prompt_logprobs is not None and limits.pipeline_parallel:
        raise InvalidArgumentError(
            "SamplingParams.prompt_logprobs is not supported with pipeline_parallel_size > 1"
        )
    width_name = "best_of" if params.best_of is not None else "n"
    if params.num_samples > limits.max_num_seqs:
        raise InvalidArgumentError(
            f"SamplingParams.{width_name}={params.num_samples} exceeds the engine's max_num_seqs "
            f"({limits.max_num_seqs}): every sample (or beam) is a running sequence"
        )
    if params.use_beam_search and not limits.copies_kv_blocks:
        raise InvalidArgumentError(
            f"SamplingParams.use_beam_search is not supported on the {limits.device} backend: it "
            "cannot copy KV blocks (Backend.copy_kv_blocks), which beams need to share them"
        )
