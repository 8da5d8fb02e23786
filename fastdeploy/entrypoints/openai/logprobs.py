"""The engine's per-token `{token_id: logprob}` dicts in OpenAI's two response formats.

The engine records, for each generated token, the `k` most likely tokens and the chosen one
(`SamplingParams.logprobs=k`). Completions use the legacy layout (parallel lists `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`); chat uses `{"content": [{token, logprob,
bytes, top_logprobs}]}`. JSON has no -inf, so a banned token's logprob is sent as -9999.0, as
vLLM does.
"""

from __future__ import annotations

import math
from typing import Any

from fastdeploy.input.tokenizer import Tokenizer

_FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else _FLOOR


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """How one token reads on its own (special tokens included)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _ranked(entry: dict[int, float], count: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda item: -item[1])[:count]


def completion_logprobs(
    tokenizer: Tokenizer,
    token_ids: list[int],
    entries: list[dict[int, float] | None],
    text_offset: int,
) -> dict[str, Any]:
    """Legacy completions logprobs for `token_ids`; `text_offset` is where their text starts.

    An entry of None (the first prompt token under `echo`, which nothing predicts) is sent as
    null, as vLLM does.
    """
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_offset
    for token_id, entry in zip(token_ids, entries, strict=False):
        text = token_text(tokenizer, token_id)
        tokens.append(text)
        if entry is None:
            token_logprobs.append(None)
            tops.append(None)
        else:
            token_logprobs.append(_finite(entry.get(token_id, -math.inf)))
            # the requested top tokens and the chosen one, as vLLM sends them
            tops.append({token_text(tokenizer, t): _finite(lp) for t, lp in _ranked(entry, len(entry))})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def echoed_logprobs(
    tokenizer: Tokenizer,
    prompt_token_ids: list[int],
    prompt_entries: list[dict[int, float] | None],
    count: int,
    generated: dict[str, Any],
) -> dict[str, Any]:
    """Completions logprobs under `echo`: the prompt's tokens (offsets from 0) with their `count`
    most likely alternatives, then `generated`."""
    trimmed = [
        None if entry is None else dict(_ranked(entry, count)) | {token: entry[token]}
        for token, entry in zip(prompt_token_ids, prompt_entries, strict=False)
    ]
    prompt = completion_logprobs(tokenizer, prompt_token_ids, trimmed, 0)
    return {key: prompt[key] + generated[key] for key in prompt}


def prompt_logprobs_field(
    tokenizer: Tokenizer, entries: list[dict[int, float] | None], count: int
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` response field: per prompt token, null (the first) or
    {token_id: {"logprob", "rank", "decoded_token"}}.

    Ranks of the `count` most likely tokens are their places (1 = most likely); the prompt's own
    token, when it is not among them, gets rank null (the engine does not rank the whole
    vocabulary).
    """
    field: list[dict[str, dict[str, Any]] | None] = []
    for entry in entries:
        if entry is None:
            field.append(None)
            continue
        ranked = _ranked(entry, len(entry))
        field.append(
            {
                str(token): {
                    "logprob": _finite(logprob),
                    "rank": place + 1 if place < count else None,
                    "decoded_token": token_text(tokenizer, token),
                }
                for place, (token, logprob) in enumerate(ranked)
            }
        )
    return field


def _chat_token(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = token_text(tokenizer, token_id)
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], entries: list[dict[int, float]], count: int
) -> dict[str, Any]:
    """Chat completions logprobs for `token_ids`, each with its `count` most likely alternatives."""
    content = []
    for token_id, entry in zip(token_ids, entries, strict=False):
        item = _chat_token(tokenizer, token_id, entry.get(token_id, -math.inf))
        item["top_logprobs"] = (
            [_chat_token(tokenizer, t, lp) for t, lp in _ranked(entry, count)] if count else []
        )
        content.append(item)
    return {"content": content}
