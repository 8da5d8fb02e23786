"""`InputProcessor`: what a user sends (text, token ids, conversations, images and videos) made
into the prompt the engine queues, and what the engine cannot serve refused with its reason.

It owns the tokenizer (with its chat template), the multimodal processor and the input limits
(`max_model_len`, the vocabulary, `limit_mm_per_prompt`). The engine builds it and exposes it as
`engine.input_processor`; `LLM`, the OpenAI server and the `chat` command prepare prompts with it
alone, so each sends the engine the same tokens for the same request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastdeploy.config import EngineConfig, ModelConfig
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.chat_template import load_chat_template
from fastdeploy.input.conversation import check_text_fits, render_conversation
from fastdeploy.input.embedding_text import TextRendering
from fastdeploy.input.multimodal.inputs import MultiModalPrompt
from fastdeploy.input.multimodal.media import MediaPolicy
from fastdeploy.input.multimodal.options import (
    build_multimodal_processor,
    check_limits,
    enforce_limits,
    media_policy,
)
from fastdeploy.input.multimodal.parts import Media, prefetch_media
from fastdeploy.input.prompts import PromptItem
from fastdeploy.input.tokenizer import Tokenizer
from fastdeploy.model_resolver import resolve_model
from fastdeploy.plugins.registry import PluginRegistry, first_that_can_load


class InputProcessor:
    """The tokenizer, chat template, multimodal processor and prompt limits of one engine."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        max_model_len: int,
        limit_mm_per_prompt: dict[str, int] | None = None,
        text_only_reason: str = "this model takes text only, not images or videos",
        policy: MediaPolicy | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        #: most images / videos per request (`limit_mm_per_prompt`), enforced before the processor
        self.mm_limits = check_limits(limit_mm_per_prompt)
        #: turns images and videos into model inputs; None for text-only models (`attach_media`)
        self.mm_processor: Any = None
        self._text_only_reason = text_only_reason
        #: where requests' media may come from (local files, fetched URLs: input/media_fetch.py)
        self.media_policy = policy if policy is not None else MediaPolicy()

    @classmethod
    def load(
        cls,
        config: EngineConfig,
        registry: PluginRegistry,
        model_path: str,
        model_config: ModelConfig,
        max_model_len: int,
    ) -> InputProcessor:
        """The tokenizer (`config.tokenizer`, else the model's) through the registered loaders,
        with `config.chat_template`, else the checkpoint's, else a plugin's for the architecture."""
        tokenizer_path = resolve_model(config.tokenizer) if config.tokenizer else model_path
        tokenizer: Tokenizer = first_that_can_load(
            registry.tokenizer_loaders(), tokenizer_path, "tokenizer loader"
        ).load(tokenizer_path)
        if config.chat_template is not None:
            tokenizer.chat_template = load_chat_template(config.chat_template)
        elif not tokenizer.chat_template:
            # a plugin may ship the template for an architecture whose checkpoints lack one
            tokenizer.chat_template = registry.chat_templates().get(model_config.architecture)
        architecture = model_config.architecture
        reason = (
            f"{architecture} runs in rank processes here (distributed_executor_backend='mp'); "
            "images and videos need the model in the engine process"
            if config.runs_in_rank_processes
            else f"{architecture} takes text only, not images or videos"
        )
        return cls(
            tokenizer,
            model_config.vocab_size,
            max_model_len,
            config.limit_mm_per_prompt,
            reason,
            media_policy(config),
        )

    def attach_media(
        self, registry: PluginRegistry, model: Any, model_config: ModelConfig, config: EngineConfig
    ) -> None:
        """Build the multimodal processor of an in-process `model` (none for text-only models)."""
        self.mm_processor = build_multimodal_processor(
            registry, model, self.tokenizer, model_config, config, self.mm_limits, self.media_policy
        )

    async def fetch_media_urls(self, media: Media) -> Media:
        """`media` with its http(s) URLs fetched on the caller's event loop (the server calls this
        before a request reaches the preprocessing threads); nothing is fetched for a model that
        refuses media, which the processing step then reports."""
        if self.mm_processor is None:
            return media
        return await prefetch_media(media, self.media_policy, self.mm_limits)

    def media_refusal(self) -> str:
        """Why this engine refuses images and videos: a text-only model, or one whose model runs in
        rank processes (the processor lives with an in-process model)."""
        return self._text_only_reason

    # --- prompts --------------------------------------------------------------------------------
    def render(
        self,
        conversation: Any,
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
        check_length: bool = False,
    ) -> PromptItem:
        """The prompt of one conversation through the chat template (`chat_template` text, None:
        the model's); with `check_length`, a text that certainly cannot fit raises
        `PromptTooLongError` before it is tokenized whole."""
        return render_conversation(
            self.tokenizer,
            conversation,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            template_kwargs=template_kwargs,
            max_model_len=self.max_model_len if check_length else None,
        )

    def check_text_fits(self, text: str) -> None:
        """`PromptTooLongError` for a text that cannot fit in `max_model_len` tokens, found
        without tokenizing all of it (see `conversation.check_text_fits`)."""
        check_text_fits(self.tokenizer, text, self.max_model_len)

    def token_ids(self, item: PromptItem) -> list[int]:
        """The token ids of a prompt item: as given, or its text encoded with special tokens.

        A prompt with images or videos is encoded by the multimodal processor, which knows the
        placeholder spellings (e.g. `<|image@placeholder|>`) and encodes each as its token.
        """
        processor = self.mm_processor
        if item.has_media and processor is not None and item.token_ids is None and item.text is not None:
            return processor.encode_text(item.text)
        if item.token_ids is not None:
            return item.token_ids
        return self.tokenizer.encode(item.text or "", add_special_tokens=True)

    def embedding_token_ids(
        self, item: PromptItem, prompt: str = "", rendering: TextRendering | None = None
    ) -> list[int]:
        """The token ids of a prompt to embed: ids as given; a text with `prompt` as the
        checkpoint's sentence-transformers files feed it (`rendering`, default: the text after
        the prompt as transformers' `tokenizer(text)` encodes it, the tokenizer's suffix appended:
        see `Tokenizer.suffix_token_ids`). The item's text becomes the text fed."""
        if item.has_media:
            raise InvalidArgumentError("runner='pooling' embeds text and token ids; media are not supported")
        if item.token_ids is not None:
            return item.token_ids
        item.text, token_ids = (rendering or TextRendering()).token_ids(
            item.text or "", prompt, self.tokenizer
        )
        return token_ids

    def prompt_inputs(self, item: PromptItem) -> tuple[list[int], MultiModalPrompt | None]:
        """A prompt item's token ids, encoded once, and with media its `MultiModalPrompt` (whose
        expanded ids are then the prompt's), as `LLM.generate` and `/v1/completions` queue it."""
        token_ids = self.token_ids(item)
        if not item.has_media:
            return token_ids, None
        multimodal = self.process_media(token_ids, item.media, item.mm_processor_kwargs)
        return multimodal.token_ids, multimodal

    def chat_inputs(
        self, item: PromptItem, media: Media, mm_processor_kwargs: dict[str, Any] | None = None
    ) -> tuple[list[int], MultiModalPrompt | None]:
        """A rendered conversation's token ids and, with `media`, its `MultiModalPrompt` (the
        rendered text re-encoded by the processor, which knows the placeholder tokens)."""
        if not media:
            return item.token_ids or [], None
        processor = self.mm_processor
        token_ids = processor.encode_text(item.text or "") if processor is not None else []
        multimodal = self.process_media(token_ids, media, mm_processor_kwargs)
        return multimodal.token_ids, multimodal

    def process_media(
        self, token_ids: list[int], media: Media, mm_processor_kwargs: dict[str, Any] | None = None
    ) -> MultiModalPrompt:
        """The processor's `MultiModalPrompt` for a prompt with media; refuses (with the reason)
        where there is none, and refuses more items than `limit_mm_per_prompt` allows, whatever
        the processor."""
        if self.mm_processor is None:
            raise InvalidArgumentError(self.media_refusal())
        enforce_limits(self.mm_limits, {"image": len(media.images), "video": len(media.videos)})
        return self.mm_processor.process(
            token_ids, media.images, media.videos, mm_processor_kwargs, labels=media.labels
        )

    # --- checks ---------------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], generates: bool = True) -> None:
        """Raise InvalidArgumentError if the engine cannot serve these prompt tokens (a prompt to
        embed, `generates=False`, may fill `max_model_len`: no token follows it)."""
        if not prompt_token_ids:
            raise InvalidArgumentError("prompt is empty: it must contain at least one token")
        vocab = self.vocab_size
        bad = [token for token in prompt_token_ids if not 0 <= token < vocab]
        if bad:
            raise InvalidArgumentError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}")
        if not generates and len(prompt_token_ids) > self.max_model_len:
            raise InvalidArgumentError(
                f"prompt has {len(prompt_token_ids)} tokens, more than max_model_len={self.max_model_len}; "
                "shorten the prompt or raise max_model_len"
            )
        if generates and len(prompt_token_ids) >= self.max_model_len:
            raise InvalidArgumentError(
                f"prompt has {len(prompt_token_ids)} tokens, which leaves no room to generate within "
                f"max_model_len={self.max_model_len}; shorten the prompt or raise max_model_len"
            )

    def engine_prompt(self, prompt_token_ids: list[int], multimodal: MultiModalPrompt | None) -> list[int]:
        """The token ids a request queues (a `MultiModalPrompt`'s expanded ones), checked; raises
        InvalidArgumentError (naming why) if the engine cannot serve them."""
        if multimodal is not None:
            if self.mm_processor is None:
                raise InvalidArgumentError(self.media_refusal())
            prompt_token_ids = multimodal.token_ids
        self.validate(prompt_token_ids)
        return prompt_token_ids
