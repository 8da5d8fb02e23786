"""`speculative_config`: which proposer drafts tokens, and how many, under FastDeploy's and vLLM's names.

Accepted keys (a dict, or its JSON text as `--speculative-config` takes it):

- `method`: "ngram" (prompt lookup: drafts copied from earlier in the sequence), "draft_model"
  (a small model proposes for the large one) or "mtp" (the target checkpoint's own
  multi-token-prediction layer, DeepSeek-V3's). vLLM's "[ngram]" spelling is accepted; with only a
  `model` given, the method is "draft_model", as in vLLM.
- `num_speculative_tokens`: drafts per step, 1 to `MAX_SPECULATIVE_TOKENS`.
- ngram: `max_ngram_size` / `min_ngram_size` (FastDeploy), or `prompt_lookup_max` /
  `prompt_lookup_min` (vLLM): the longest and shortest suffix matched (defaults 5 and 2).
- draft_model: `model` (a path or embedded model name, as `LLM(model=...)` takes; its vocabulary
  must be the target's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastdeploy.errors import InvalidArgumentError

MAX_SPECULATIVE_TOKENS = 16
METHODS = ("ngram", "draft_model", "mtp")
_ALIASES = {"[ngram]": "ngram", "draft": "draft_model"}
_KNOWN_KEYS = {
    "method",
    "num_speculative_tokens",
    "max_ngram_size",
    "min_ngram_size",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "model",
}


@dataclass(frozen=True)
class SpeculativeConfig:
    """A validated speculative decoding setup."""

    method: str
    num_speculative_tokens: int
    max_ngram_size: int = 5
    min_ngram_size: int = 2
    #: the draft model (method "draft_model")
    model: str | None = None


def _int_field(raw: dict[str, Any], names: tuple[str, ...], default: int | None) -> int | None:
    given = [name for name in names if raw.get(name) is not None]
    if len(given) > 1 and raw[given[0]] != raw[given[1]]:
        raise InvalidArgumentError(
            f"speculative_config gives both {given[0]}={raw[given[0]]!r} and {given[1]}={raw[given[1]]!r}; "
            "they are the same setting"
        )
    if not given:
        return default
    value = raw[given[0]]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"speculative_config.{given[0]} must be an int, got {value!r}")
    return value


def parse_speculative_config(
    raw: dict[str, Any] | str | SpeculativeConfig | None,
) -> SpeculativeConfig | None:
    """The validated config, or None when speculation is off; errors name the offending key."""
    if raw is None or isinstance(raw, SpeculativeConfig):
        return raw
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"speculative_config is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidArgumentError(f"speculative_config must be a dict (or its JSON text), got {raw!r}")
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise InvalidArgumentError(
            f"speculative_config has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN_KEYS))}"
        )
    method = raw.get("method") or ("draft_model" if raw.get("model") else None)
    method = _ALIASES.get(method, method)
    if method not in METHODS:
        raise InvalidArgumentError(
            f"speculative_config.method must be one of {', '.join(METHODS)}, got {raw.get('method')!r}"
        )
    count = _int_field(raw, ("num_speculative_tokens",), None)
    if count is None or not 1 <= count <= MAX_SPECULATIVE_TOKENS:
        raise InvalidArgumentError(
            f"speculative_config.num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got "
            f"{raw.get('num_speculative_tokens')!r}"
        )
    longest = _int_field(raw, ("max_ngram_size", "prompt_lookup_max"), 5)
    shortest = _int_field(raw, ("min_ngram_size", "prompt_lookup_min"), 2)
    if not 1 <= shortest <= longest:
        raise InvalidArgumentError(
            f"speculative_config needs 1 <= min_ngram_size <= max_ngram_size, got min {shortest}, max {longest}"
        )
    model = raw.get("model")
    if method == "draft_model" and not isinstance(model, str):
        raise InvalidArgumentError(
            "speculative_config.model must name the draft model (a path or an embedded model name) "
            "for method 'draft_model'"
        )
    return SpeculativeConfig(method, count, longest, shortest, model if method == "draft_model" else None)
