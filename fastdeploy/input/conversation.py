"""How a conversation becomes a prompt: the chat template, then encoding without adding special
tokens again (the template writes them), with the template arguments checked.

`InputProcessor.render` is the one caller; the offline `LLM`, the OpenAI server and the `chat`
command go through it, so each sends the engine the same tokens for the same request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastdeploy.errors import InvalidArgumentError, PromptTooLongError
from fastdeploy.input.prompts import PromptItem
from fastdeploy.input.tokenizer import Tokenizer


def thinking_enabled(template_kwargs: Mapping[str, Any] | None) -> bool:
    """False only when the request turned thinking off (`enable_thinking=False`)."""
    return bool((template_kwargs or {}).get("enable_thinking", True))


def with_tools(
    template_kwargs: Mapping[str, Any] | None, tools: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """Template kwargs with the request's `tools` (the variable chat templates render them from)."""
    kwargs = dict(template_kwargs or {})
    if tools is not None:
        kwargs["tools"] = tools
    return kwargs


#: arguments of `apply_chat_template` itself, which a template kwarg would collide with
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tokenize", "add_generation_prompt", "chat_template"}
)


#: characters per token of room beyond which a text is probed before it is tokenized whole
PROBE_CHARS_PER_TOKEN = 8
#: tokens the cut at the probe's end may merge away: a probe over max_model_len + this proves it
PROBE_MARGIN = 64


def check_text_fits(tokenizer: Tokenizer, text: str, max_model_len: int) -> None:
    """Raise `PromptTooLongError` for a text that cannot fit in `max_model_len` tokens, without
    tokenizing all of it: a prompt of megabytes took seconds of a server's preprocessing thread
    before its length was checked. Texts over 8 characters per token of room are probed by
    tokenizing that prefix; only the tokens at its cut can differ from the whole text's, so a
    prefix already over `max_model_len + PROBE_MARGIN` tokens proves the whole is too long."""
    probe = max_model_len * PROBE_CHARS_PER_TOKEN
    if len(text) <= probe:
        return
    count = len(tokenizer.encode(text[:probe], add_special_tokens=False))
    if count > max_model_len + PROBE_MARGIN:
        raise PromptTooLongError(
            f"the prompt is longer than this model's maximum context length of {max_model_len} tokens: "
            f"its first {probe} of {len(text)} characters alone are {count} tokens"
        )


def render_conversation(
    tokenizer: Tokenizer,
    conversation: Any,
    *,
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    template_kwargs: Mapping[str, Any] | None = None,
    max_model_len: int | None = None,
) -> PromptItem:
    """The prompt of one conversation; raises `InvalidArgumentError` if it cannot be rendered
    (`PromptTooLongError` if, given `max_model_len`, it certainly cannot fit: `check_text_fits`).

    `chat_template` is template text (None: the model's own template).
    """
    kwargs = dict(template_kwargs or {})
    if not isinstance(add_generation_prompt, bool):
        raise InvalidArgumentError(f"add_generation_prompt must be a bool, got {add_generation_prompt!r}")
    if not isinstance(kwargs.get("enable_thinking", True), bool):
        raise InvalidArgumentError(
            f"chat_template_kwargs enable_thinking must be a bool, got {kwargs['enable_thinking']!r}"
        )
    reserved = sorted(_RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if reserved:
        raise InvalidArgumentError(
            f"chat_template_kwargs cannot set {', '.join(map(repr, reserved))}: "
            "pass add_generation_prompt / chat_template as arguments of their own"
        )
    text = tokenizer.apply_chat_template(
        conversation,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        **kwargs,
    )
    if max_model_len is not None:
        check_text_fits(tokenizer, text, max_model_len)
    return PromptItem(
        text=text,
        token_ids=tokenizer.encode(text, add_special_tokens=False),
        thinking_enabled=thinking_enabled(kwargs),
    )
