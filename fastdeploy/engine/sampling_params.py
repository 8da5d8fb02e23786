"""Per-request sampling settings, validated when built (FastDeploy's and vLLM's field names)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fastdeploy.engine.guided.params import GuidedDecodingParams, StructuredOutputsParams
from fastdeploy.errors import InvalidArgumentError

#: the guided-decoding parameter classes are importable from here too, as in FastDeploy and vLLM
__all__ = ["GuidedDecodingParams", "SamplingParams", "StructuredOutputsParams"]

_SEED_LIMIT = 2**63


def _check_number(name: str, value: Any, *, integer: bool = False) -> None:
    allowed = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed):
        kind = "an int" if integer else "a number"
        raise InvalidArgumentError(
            f"SamplingParams.{name} must be {kind}, got {type(value).__name__} {value!r}"
        )
    if not integer and not math.isfinite(value):
        raise InvalidArgumentError(f"SamplingParams.{name} must be finite, got {value!r}")


def _check_range(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> None:
    below = value <= low if low_open else value < low
    if below or value > high:
        bracket = "(" if low_open else "["
        raise InvalidArgumentError(f"SamplingParams.{name} must be in {bracket}{low}, {high}], got {value!r}")


def _string_list(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise InvalidArgumentError(
            f"SamplingParams.{name} must be a string or a list of strings, got {value!r}"
        )
    if any(item == "" for item in value):
        raise InvalidArgumentError(f"SamplingParams.{name} must not contain empty strings")
    return list(value)


@dataclass
class SamplingParams:
    """How to sample one request's output.

    `temperature=0` is greedy decoding. `top_k` of 0 or -1 and `top_p=1` disable those filters.
    `max_tokens` counts generated tokens (None: until a stop condition or `max_model_len`).
    Requests with a `seed` sample the same tokens whatever else shares their batch.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    #: with a reasoning parser: thinking tokens allowed before the end-of-thinking tag is forced
    reasoning_max_tokens: int | None = None
    #: constrain the output to a JSON schema, regex, choice, grammar, ... (`GuidedDecodingParams`
    #: or a dict of its fields); applied after the reasoning when a reasoning parser is set
    guided_decoding: GuidedDecodingParams | dict[str, Any] | None = None
    #: vLLM's newer name for `guided_decoding` (`StructuredOutputsParams`); set one or the other
    structured_outputs: GuidedDecodingParams | dict[str, Any] | None = None
    #: per prompt token (after the first), {token_id: logprob} of this many most likely tokens
    #: plus the prompt's own token, in `RequestOutput.prompt_logprobs` (vLLM's field)
    prompt_logprobs: int | None = None
    #: samples drawn (>= n); the n with the highest cumulative logprob are returned. With beam
    #: search: the beam width (default n)
    best_of: int | None = None
    #: beam search instead of sampling (temperature must be 0); see docs/decoding.md
    use_beam_search: bool = False
    #: beam search ranks finished beams by cumulative logprob / length ** length_penalty
    length_penalty: float = 1.0
    #: beam search stops: True when `best_of` beams finished, False when no running beam can
    #: beat the finished ones (transformers' heuristic), "never" by the exact bound
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        _check_number("n", self.n, integer=True)
        if self.n < 1:
            raise InvalidArgumentError(f"SamplingParams.n must be >= 1, got {self.n}")
        for name in ("presence_penalty", "frequency_penalty"):
            _check_number(name, getattr(self, name))
            _check_range(name, getattr(self, name), -2.0, 2.0)
        _check_number("repetition_penalty", self.repetition_penalty)
        _check_range("repetition_penalty", self.repetition_penalty, 0.0, 100.0, low_open=True)
        _check_number("temperature", self.temperature)
        _check_range("temperature", self.temperature, 0.0, 100.0)
        _check_number("top_p", self.top_p)
        _check_range("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_number("top_k", self.top_k, integer=True)
        if self.top_k < -1:
            raise InvalidArgumentError(
                f"SamplingParams.top_k must be -1, 0 (disabled) or >= 1, got {self.top_k}"
            )
        _check_number("min_p", self.min_p)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            _check_number("seed", self.seed, integer=True)
            if not 0 <= self.seed < _SEED_LIMIT:
                raise InvalidArgumentError(f"SamplingParams.seed must be in [0, 2**63), got {self.seed}")
        if self.max_tokens is not None:
            _check_number("max_tokens", self.max_tokens, integer=True)
            if self.max_tokens < 1:
                raise InvalidArgumentError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        _check_number("min_tokens", self.min_tokens, integer=True)
        if self.min_tokens < 0:
            raise InvalidArgumentError(f"SamplingParams.min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidArgumentError(
                f"SamplingParams.min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        if self.reasoning_max_tokens is not None:
            _check_number("reasoning_max_tokens", self.reasoning_max_tokens, integer=True)
            if self.reasoning_max_tokens < 1:
                raise InvalidArgumentError(
                    f"SamplingParams.reasoning_max_tokens must be >= 1, got {self.reasoning_max_tokens}"
                )
        _check_logprob_counts(self)
        _check_best_of(self)
        _check_beam_search(self)
        self.stop = _string_list("stop", self.stop)
        self.bad_words = _string_list("bad_words", self.bad_words)
        stop_ids = self.stop_token_ids or []
        if not isinstance(stop_ids, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in stop_ids
        ):
            raise InvalidArgumentError(
                f"SamplingParams.stop_token_ids must be a list of non-negative ints, got {self.stop_token_ids!r}"
            )
        self.stop_token_ids = list(stop_ids)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(
                    f"SamplingParams.{name} must be a bool, got {getattr(self, name)!r}"
                )
        self._check_guided_decoding()

    def _check_guided_decoding(self) -> None:
        """`guided_decoding` and `structured_outputs` are one setting under two names."""
        both = self.guided_decoding is not None and self.structured_outputs is not None
        if both and self.guided_decoding is not self.structured_outputs:
            raise InvalidArgumentError(
                "SamplingParams.structured_outputs and SamplingParams.guided_decoding are the same "
                "setting under vLLM's and FastDeploy's names; set only one"
            )
        chosen = self.guided_decoding if self.guided_decoding is not None else self.structured_outputs
        self.guided_decoding = self.structured_outputs = GuidedDecodingParams.from_value(chosen)

    @property
    def num_samples(self) -> int:
        """Sequences drawn for the request: `best_of` (or `n`); for beam search, its width."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def greedy(self) -> bool:
        """Whether sampling reduces to argmax."""
        return self.temperature == 0.0 or self.top_k == 1


def _check_logprob_counts(params: SamplingParams) -> None:
    """`logprobs` and `prompt_logprobs` are counts >= 0; the engine caps them at its `max_logprobs`."""
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None:
            _check_number(name, value, integer=True)
            if value < 0:
                raise InvalidArgumentError(f"SamplingParams.{name} must be >= 0, got {value}")


def _check_best_of(params: SamplingParams) -> None:
    """`best_of` >= n; drawing more samples than returned needs random sampling (or beams)."""
    if params.best_of is None:
        return
    _check_number("best_of", params.best_of, integer=True)
    if params.best_of < params.n:
        raise InvalidArgumentError(f"SamplingParams.best_of must be >= n ({params.n}), got {params.best_of}")
    if params.best_of > params.n and params.greedy and not params.use_beam_search:
        raise InvalidArgumentError(
            f"SamplingParams.best_of={params.best_of} > n needs random sampling: greedy samples "
            "(temperature 0 or top_k 1) are all the same; set temperature > 0 or use_beam_search=True"
        )


#: settings beam search does not combine with: (field, value it must keep, why)
_BEAM_EXCLUSIONS = (
    ("temperature", 0.0, "beam search is deterministic; sampled beams are not supported"),
    ("top_p", 1.0, "beam search ranks every token"),
    ("min_p", 0.0, "beam search ranks every token"),
    ("presence_penalty", 0.0, "penalties are not applied to beam scores"),
    ("frequency_penalty", 0.0, "penalties are not applied to beam scores"),
    ("repetition_penalty", 1.0, "penalties are not applied to beam scores"),
)
#: the sampling settings beam search keeps at their defaults: a checkpoint's recommended ones
#: (generation_config.json) are not applied to a request that asks for beam search
BEAM_SEARCH_FIXED_FIELDS = frozenset(name for name, _, _ in _BEAM_EXCLUSIONS) | {"top_k"}


def _check_beam_search(params: SamplingParams) -> None:
    """Beam fields are well-formed, used only with beam search, and beam search excludes sampling."""
    for name in ("use_beam_search",):
        if not isinstance(getattr(params, name), bool):
            raise InvalidArgumentError(f"SamplingParams.{name} must be a bool, got {getattr(params, name)!r}")
    _check_number("length_penalty", params.length_penalty)
    if params.early_stopping not in (True, False, "never"):
        raise InvalidArgumentError(
            f"SamplingParams.early_stopping must be True, False or 'never', got {params.early_stopping!r}"
        )
    if not params.use_beam_search:
        if params.length_penalty != 1.0:
            raise InvalidArgumentError("SamplingParams.length_penalty only applies with use_beam_search=True")
        if params.early_stopping is not False:
            raise InvalidArgumentError("SamplingParams.early_stopping only applies with use_beam_search=True")
        return
    for name, allowed, why in _BEAM_EXCLUSIONS:
        if getattr(params, name) != allowed:
            raise InvalidArgumentError(
                f"SamplingParams.{name} must be {allowed} with use_beam_search=True ({why}), "
                f"got {getattr(params, name)!r}"
            )
    if params.top_k not in (0, -1):
        raise InvalidArgumentError(
            f"SamplingParams.top_k must be 0 or -1 with use_beam_search=True (beam search ranks every "
            f"token), got {params.top_k}"
        )
    if params.stop:
        raise InvalidArgumentError(
            "SamplingParams.stop (stop strings) is not supported with use_beam_search=True; "
            "use stop_token_ids"
        )
    for name in ("guided_decoding", "structured_outputs"):
        if getattr(params, name) is not None:
            raise InvalidArgumentError(
                f"SamplingParams.{name} (guided decoding) is not supported with use_beam_search=True: "
                "beams are ranked over the whole vocabulary; drop one of the two"
            )
