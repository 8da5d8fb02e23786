"""How a text to embed becomes token ids, as sentence-transformers 6 feeds the checkpoint.

sentence-transformers 6 saves the modalities its `Transformer` module takes in
`sentence_bert_config.json` (`modality_config`). When that holds a "message" modality (a model
whose tokenizer has a chat template, saved by version 6), every text is embedded as a chat: a
user message (content a string in the "flat" format, a list of typed parts in "structured"),
after a system message holding the prompt (`prompt_name`, the default prompt) when there is one,
rendered by the tokenizer's chat template and tokenized without the tokenizer's own special
tokens. `processing_kwargs["chat_template"]` reaches the template (`add_generation_prompt` is
off unless it sets it). A checkpoint without `modality_config` (saved by older versions, as
Qwen3-Embedding is published) is text-only: the prompt is put before the text, which the
tokenizer encodes with its special tokens.

Either way a sentence-transformers checkpoint cuts what it feeds to its `max_seq_length` (else
the tokenizer's `model_max_length`, at most `max_position_embeddings`): a text keeps the
tokenizer's special tokens around its cut words; a chat is cut at the end and then gets the
template's tail back over its last tokens (`restore_suffix`, on unless the config turns it off),
so that last-token pooling still reads the template's end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.errors import UnsupportedModelError
from fastdeploy.input.tokenizer import Tokenizer

#: sentence-transformers' Transformer module config (the first name it reads)
CONFIG_FILE = "sentence_bert_config.json"
#: chat templates that take content as typed parts (sentence-transformers' "auto" format rule)
_STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
#: model types sentence-transformers knows to take string content
_FLAT_MODEL_TYPES = ("apertus", "deepseek_v3", "gpt_oss", "seed_oss")
#: `processing_kwargs["chat_template"]` keys that size the tokenization, not the template
_SIZE_KEYS = ("padding", "truncation", "max_length", "return_tensors", "restore_suffix")
#: two user contents that tokenize differently: what their renders share at the end is the tail
_FILLERS = ("0", "1 2 3 4")


@dataclass(frozen=True)
class TextRendering:
    """How this checkpoint's texts are fed: raw (`message_format` None) or as chat messages, cut
    to `max_length` tokens (None: never cut)."""

    #: None: the text itself; "flat" or "structured": a user message through the chat template
    message_format: str | None = None
    #: variables the chat template receives (`processing_kwargs["chat_template"]`)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_length: int | None = None
    #: a cut chat gets the template's tail back
    restore_suffix: bool = True

    def token_ids(self, text: str, prompt: str, tokenizer: Tokenizer) -> tuple[str, list[int]]:
        """What the checkpoint is fed for `text` with `prompt` (a named prompt's text, may be
        empty): the text fed (the prompt and text, or the rendered chat) and its token ids."""
        if self.message_format is None:
            fed = prompt + text
            suffix = list(tokenizer.suffix_token_ids)
            ids = tokenizer.encode(fed, add_special_tokens=True)
            if self.max_length is not None and len(ids) + len(suffix) > self.max_length:
                ids = ids[: max(self.max_length - len(suffix), 0)]
            return fed, ids + suffix
        fed = self._render(tokenizer, text, prompt)
        ids = tokenizer.encode(fed, add_special_tokens=False)
        if self.max_length is not None and len(ids) > self.max_length:
            ids = ids[: self.max_length]
            tail = self._tail(tokenizer, prompt) if self.restore_suffix else []
            keep = min(len(tail), len(ids))
            if keep:
                ids[-keep:] = tail[-keep:]
        return fed, ids

    def _render(self, tokenizer: Tokenizer, text: str, prompt: str) -> str:
        messages = [self._message("user", text)]
        if prompt:
            messages.insert(0, self._message("system", prompt))
        kwargs = dict(self.template_kwargs)
        add_generation_prompt = bool(kwargs.pop("add_generation_prompt", False))
        return str(
            tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        )

    def _tail(self, tokenizer: Tokenizer, prompt: str) -> list[int]:
        """The template's tokens after the user's content: the longest common end of two renders
        with different contents (none if they never differ)."""
        first, second = (
            tokenizer.encode(self._render(tokenizer, filler, prompt), add_special_tokens=False)
            for filler in _FILLERS
        )
        count = 0
        for left, right in zip(reversed(first), reversed(second), strict=False):
            if left != right:
                break
            count += 1
        return first[len(first) - count :] if 0 < count < min(len(first), len(second)) else []

    def _message(self, role: str, text: str) -> dict[str, Any]:
        content: Any = text if self.message_format == "flat" else [{"type": "text", "text": text}]
        return {"role": role, "content": content}


def read_text_rendering(
    model_path: str, model_config: Mapping[str, Any], chat_template: str | None
) -> TextRendering:
    """The rendering `sentence_bert_config.json` asks for (raw text, never cut, without one;
    raw text without a `modality_config` in it); refuses a checkpoint whose Transformer takes
    neither text nor messages. `model_config` is config.json's; `chat_template` (the
    tokenizer's) decides a "format": "auto" as sentence-transformers does."""
    path = os.path.join(model_path, CONFIG_FILE)
    if not os.path.isfile(path):
        return TextRendering()
    config = _json_object(path)
    processing = _object(config.get("processing_kwargs"), path, "processing_kwargs")
    template_kwargs = _object(processing.get("chat_template"), path, "processing_kwargs chat_template")
    max_length = _max_length(model_path, config, processing, model_config)
    modalities = config.get("modality_config")
    if modalities is None:
        return TextRendering(max_length=max_length)
    if not isinstance(modalities, Mapping):
        raise UnsupportedModelError(f"{path}: modality_config must be an object, got {modalities!r}")
    if "message" not in modalities:
        if "text" not in modalities:
            raise UnsupportedModelError(
                f"{path}: modality_config takes {', '.join(sorted(modalities))}, neither text nor message; "
                "runner='pooling' embeds texts"
            )
        return TextRendering(max_length=max_length)
    message = modalities["message"] if isinstance(modalities["message"], Mapping) else {}
    message_format = message.get("format", "auto")
    if message_format == "auto":
        message_format = _inferred_format(str(model_config.get("model_type", "")), chat_template)
    if message_format not in ("flat", "structured"):
        raise UnsupportedModelError(
            f"{path}: modality_config message format {message_format!r} is not flat, structured or auto"
        )
    if not chat_template:
        raise UnsupportedModelError(
            f"{path}: modality_config has a 'message' modality (texts are embedded as chat messages), "
            "but the tokenizer has no chat template to render them"
        )
    kept = {key: value for key, value in template_kwargs.items() if key not in _SIZE_KEYS}
    restore = template_kwargs.get("restore_suffix", True)
    return TextRendering(message_format, kept, max_length, bool(restore))


def _json_object(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"{path} is not readable JSON: {exc}") from exc
    return _object(value, path, "the file")


def _object(value: Any, path: str, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UnsupportedModelError(f"{path}: {what} must be a JSON object, got {value!r}")
    return dict(value)


def _max_length(
    model_path: str, config: Mapping[str, Any], processing: Mapping[str, Any], model_config: Mapping[str, Any]
) -> int | None:
    """Where sentence-transformers cuts: a `max_length` or `truncation` in `processing_kwargs`
    (the chat template's, the text's, then the common ones), else `max_seq_length`, else the
    tokenizer's `model_max_length` at most `max_position_embeddings`."""
    buckets = [
        _object(processing.get(key), CONFIG_FILE, f"processing_kwargs {key}")
        for key in ("chat_template", "text", "common")
    ]
    truncation = next((bucket["truncation"] for bucket in buckets if "truncation" in bucket), True)
    if truncation in (False, "do_not_truncate"):
        return None
    limit = next((bucket["max_length"] for bucket in buckets if bucket.get("max_length") is not None), None)
    if limit is None:
        limit = config.get("max_seq_length")
    if limit is None:
        tokenizer_config = os.path.join(model_path, "tokenizer_config.json")
        tokenizer_max = (
            _json_object(tokenizer_config).get("model_max_length")
            if os.path.isfile(tokenizer_config)
            else None
        )
        limits = [value for value in (tokenizer_max, model_config.get("max_position_embeddings")) if value]
        limit = min(limits) if limits else None
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 1):
        raise UnsupportedModelError(f"{CONFIG_FILE}: the sequence length {limit!r} is not a positive number")
    return int(limit) if limit is not None else None


def _inferred_format(model_type: str, chat_template: str | None) -> str:
    """sentence-transformers' "auto" message format: flat for the model types it lists, else
    structured unless a chat template shows no sign of typed parts."""
    if model_type in _FLAT_MODEL_TYPES:
        return "flat"
    if not chat_template or any(pattern in chat_template for pattern in _STRUCTURED_PATTERNS):
        return "structured"
    return "flat"
