"""Normalises the prompt forms `LLM.generate` and `/v1/completions` accept into one list of prompt items.

A malformed element of a batch becomes an item carrying its error, so it fails alone; only a
top-level value of the wrong type is raised immediately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.multimodal.parts import Media, multimodal_data


@dataclass
class PromptItem:
    """One prompt: text, token ids, or the reason it is invalid."""

    text: str | None = None
    token_ids: list[int] | None = None
    error: str | None = None
    #: False when a chat request turned thinking off (for the reasoning parser)
    thinking_enabled: bool = True
    #: images and videos, in the order of their placeholders
    media: Media | None = None
    #: per-request multimodal processor settings (pixel bounds, frame sampling)
    mm_processor_kwargs: dict[str, Any] | None = None

    @property
    def has_media(self) -> bool:
        return bool(self.media)


def _is_token_id(value: Any) -> bool:
    """An int (numpy's integers too, as tokenizers return them), never a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_token_id(x) for x in value)


def _looks_like_token_ids(value: Any) -> bool:
    """A list of numbers with an int among them: meant as token ids, whatever else it holds."""
    return (
        isinstance(value, (list, tuple))
        and any(_is_token_id(x) for x in value)
        and all(isinstance(x, (int, float, np.number, np.bool_)) for x in value)
    )


def _bad_token_ids(value: list[Any] | tuple[Any, ...], where: str = "") -> PromptItem:
    index, item = next((i, x) for i, x in enumerate(value) if not _is_token_id(x))
    return PromptItem(
        error=f"{where}token ids must be ints; item {index} of the list is a {type(item).__name__} ({item!r})"
    )


def _item(value: Any, index: int) -> PromptItem:
    if isinstance(value, str):
        if not value:
            return PromptItem(text=value, error=f"prompt {index} is an empty string")
        return PromptItem(text=value)
    if _is_token_ids(value):
        return PromptItem(token_ids=[int(x) for x in value])
    if isinstance(value, dict):
        return _dict_item(value, index)
    if _looks_like_token_ids(value):
        return _bad_token_ids(value, f"prompt {index}: ")
    return PromptItem(
        error=f"prompt {index} must be a str, a list of token ids or a dict with 'prompt'/'prompt_token_ids', "
        f"got {type(value).__name__}"
    )


def _dict_item(value: dict[str, Any], index: int) -> PromptItem:
    item = _text_or_ids(value, index)
    data = value.get("multimodal_data", value.get("multi_modal_data"))
    if item.error is None and data is not None:
        try:
            item.media = multimodal_data(data, f"prompt {index}")
        except InvalidArgumentError as exc:
            item.error = str(exc)
        kwargs = value.get("mm_processor_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            item.error = f"prompt {index}: mm_processor_kwargs must be a dict"
        item.mm_processor_kwargs = kwargs
    return item


def _text_or_ids(value: dict[str, Any], index: int) -> PromptItem:
    if "prompt_token_ids" in value:
        ids = value["prompt_token_ids"]
        if not _is_token_ids(ids):
            return PromptItem(error=f"prompt {index}: 'prompt_token_ids' must be a non-empty list of ints")
        return PromptItem(text=value.get("prompt"), token_ids=[int(x) for x in ids])
    if "prompt" in value:
        return (
            _item(value["prompt"], index)
            if isinstance(value["prompt"], str)
            else PromptItem(
                error=f"prompt {index}: 'prompt' must be a str, got {type(value['prompt']).__name__}"
            )
        )
    return PromptItem(error=f"prompt {index} is a dict without 'prompt' or 'prompt_token_ids'")


def normalize_prompts(prompts: Any) -> list[PromptItem]:
    """One PromptItem per prompt of `prompts` (str, list[str], list[int], list[list[int]], dict(s))."""
    if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
        return [_item(prompts, 0)]
    if _looks_like_token_ids(prompts):
        return [_bad_token_ids(prompts)]
    if isinstance(prompts, (list, tuple)):
        return [_item(value, index) for index, value in enumerate(prompts)]
    raise InvalidArgumentError(
        "prompts must be a str, list[str], list[int], list[list[int]], a dict or a list of dicts; "
        f"got {type(prompts).__name__}"
    )
