"""The tokenizer interface the engine uses, and the loader interface plugins register.

Concrete tokenizers wrap well-kept libraries (`tokenizers`, `sentencepiece`); this module only
fixes what the engine relies on, so any plugin's tokenizer can stand in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.chat_template import render_chat_template


def require_text(text: Any) -> None:
    """The check every `Tokenizer.encode` starts with: a clear error for a non-str argument, or
    for a str that is not valid Unicode (a lone surrogate such as "\\ud800", which Python
    strings may hold and tokenizers refuse with a TypeError of their own)."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text to encode must be a str, got {type(text).__name__}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"text to encode is not valid Unicode: {exc.reason} ({text[exc.start]!r}) at character {exc.start}"
            ) from None


class Tokenizer(ABC):
    """Text <-> token ids, special tokens and the model's chat template."""

    #: ids that end generation unless `ignore_eos` (the EOS id and template end tokens).
    eos_token_ids: frozenset[int]
    bos_token_id: int | None
    #: ids never shown in text when `skip_special_tokens` (control tokens).
    special_token_ids: frozenset[int]
    #: the Jinja chat template shipped with the model, if any.
    chat_template: str | None
    #: further templates by name (e.g. "tool_use"), selectable as `chat_template=name`.
    named_chat_templates: dict[str, str] = {}
    #: ids the tokenizer's files append after a text (a tokenizer.json post-processor's suffix, such
    #: as Qwen3-Embedding's `<|endoftext|>`). transformers' `tokenizer(text)` appends them and so
    #: does the pooling runner, whose last-token pooling reads that token; `encode` never does (a
    #: prompt to complete must not end with an end token).
    suffix_token_ids: tuple[int, ...] = ()

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids, including added special tokens."""

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text are kept whole."""

    @abstractmethod
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `token_ids`."""

    @abstractmethod
    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary piece of one id (for logprob displays), or None if out of range."""

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """Render `messages` with the model's (or the given) Jinja template, as HF does.

        `chat_template` is a template string or the name of one of `named_chat_templates`.
        """
        if chat_template is not None and chat_template in self.named_chat_templates:
            chat_template = self.named_chat_templates[chat_template]
        text = render_chat_template(
            chat_template or self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.template_special_tokens(),
            **template_kwargs,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def template_special_tokens(self) -> dict[str, str]:
        """Values templates reference as `bos_token` / `eos_token`."""
        return {}


class TokenizerLoader(ABC):
    """Builds a `Tokenizer` for a model path; registered through `fastdeploy_tokenizer_loaders`."""

    name: str = "base"
    #: loaders are asked in descending priority; the first that can load wins.
    priority: int = 0
    #: what this loader reads, in words, for the error shown when no loader can read a path
    reads: str = "tokenizer files"

    @abstractmethod
    def can_load(self, model_path: str) -> bool:
        """Whether this loader understands the file or directory at `model_path`."""

    @abstractmethod
    def load(self, model_path: str) -> Tokenizer:
        """Build the tokenizer; raise with a specific message if the files are malformed."""
