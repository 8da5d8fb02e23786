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
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.errors import UnsupportedModelError
from fastdeploy.input.prompts import PromptItem
from fastdeploy.input.tokenizer import Tokenizer

#: sentence-transformers' Transformer module config (the first name it reads)
CONFIG_FILE = "sentence_bert_config.json"
#: chat templates that take content as typed parts (sentence-transformers' "auto" format rule)
_STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
#: model types sentence-transformers knows to take string content
_FLAT_MODEL_TYPES = ("apertus", "deepseek_v3", "gpt_oss", "seed_oss")
#: `processing_kwargs["chat_template"]` keys that size the tokenization, not the template
_SIZE_KEYS = ("padding", "truncation", "max_length", "return_tensors", "restore_suffix")


@dataclass(frozen=True)
class TextRendering:
    """How this checkpoint's texts are fed: raw (`message_format` None) or as chat messages."""

    #: None: the text itself; "flat" or "structured": a user message through the chat template
    message_format: str | None = None
    #: variables the chat template receives (`processing_kwargs["chat_template"]`)
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def apply(self, item: PromptItem, prompt: str, tokenizer: Tokenizer) -> None:
        """Put `prompt` (a named prompt's text, may be empty) into a text item as the checkpoint
        does: before the text, or as a system message with the text rendered as a chat (then the
        item's `text` is the rendered chat and its `token_ids` are set). Token ids stay as given."""
        if item.error is not None or item.token_ids is not None or item.text is None:
            return
        if self.message_format is None:
            item.text = prompt + item.text
            return
        messages = [self._message("user", item.text)]
        if prompt:
            messages.insert(0, self._message("system", prompt))
        kwargs = dict(self.template_kwargs)
        add_generation_prompt = bool(kwargs.pop("add_generation_prompt", False))
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        item.text = str(text)
        item.token_ids = tokenizer.encode(item.text, add_special_tokens=False)

    def _message(self, role: str, text: str) -> dict[str, Any]:
        content: Any = text if self.message_format == "flat" else [{"type": "text", "text": text}]
        return {"role": role, "content": content}


def read_text_rendering(model_path: str, model_type: str, chat_template: str | None) -> TextRendering:
    """The rendering `sentence_bert_config.json` asks for (raw text without one, or without a
    `modality_config` in it); refuses a checkpoint whose Transformer takes neither text nor
    messages. `chat_template` (the tokenizer's) decides a "format": "auto" as
    sentence-transformers does."""
    path = os.path.join(model_path, CONFIG_FILE)
    if not os.path.isfile(path):
        return TextRendering()
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"{path} is not readable JSON: {exc}") from exc
    modalities = config.get("modality_config") if isinstance(config, dict) else None
    if modalities is None:
        return TextRendering()
    if not isinstance(modalities, Mapping):
        raise UnsupportedModelError(f"{path}: modality_config must be an object, got {modalities!r}")
    if "message" not in modalities:
        if "text" not in modalities:
            raise UnsupportedModelError(
                f"{path}: modality_config takes {', '.join(sorted(modalities))}, neither text nor message; "
                "runner='pooling' embeds texts"
            )
        return TextRendering()
    message = modalities["message"] if isinstance(modalities["message"], Mapping) else {}
    message_format = message.get("format", "auto")
    if message_format == "auto":
        message_format = _inferred_format(model_type, chat_template)
    if message_format not in ("flat", "structured"):
        raise UnsupportedModelError(
            f"{path}: modality_config message format {message_format!r} is not flat, structured or auto"
        )
    if not chat_template:
        raise UnsupportedModelError(
            f"{path}: modality_config has a 'message' modality (texts are embedded as chat messages), "
            "but the tokenizer has no chat template to render them"
        )
    processing = config.get("processing_kwargs") or {}
    template_kwargs = processing.get("chat_template") if isinstance(processing, Mapping) else None
    if template_kwargs is not None and not isinstance(template_kwargs, Mapping):
        raise UnsupportedModelError(f"{path}: processing_kwargs chat_template must be an object")
    kept = {key: value for key, value in (template_kwargs or {}).items() if key not in _SIZE_KEYS}
    return TextRendering(message_format, kept)


def _inferred_format(model_type: str, chat_template: str | None) -> str:
    """sentence-transformers' "auto" message format: flat for the model types it lists, else
    structured unless a chat template shows no sign of typed parts."""
    if model_type in _FLAT_MODEL_TYPES:
        return "flat"
    if not chat_template or any(pattern in chat_template for pattern in _STRUCTURED_PATTERNS):
        return "structured"
    return "flat"
