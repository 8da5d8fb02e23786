"""`POST /tokenize` and `POST /detokenize`, in vLLM's request and response shapes.

`/tokenize` counts a `prompt` (encoded as `/v1/completions` encodes it, special tokens added
unless `add_special_tokens: false`) or `messages` (rendered with the chat template exactly as
`/v1/chat/completions` renders them, images included, so the count is what a chat request would
queue; no special tokens are added to the template's unless asked). It answers `count`,
`max_model_len` and `tokens` (and `token_strs`, the vocabulary pieces, with `return_token_strs`).
A prompt longer than the context is counted, not refused: clients use this to budget.
`/detokenize` turns `tokens` back into text, special tokens written out.
"""

from __future__ import annotations

from typing import Any

from pydantic import StrictInt
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fastdeploy.entrypoints.openai.chat_tools import plan_chat_tools
from fastdeploy.entrypoints.openai.errors import invalid_request
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest, OpenAIBaseModel
from fastdeploy.entrypoints.openai.serving import ServingContext, parse_body
from fastdeploy.entrypoints.openai.serving_chat import (
    check_request_template,
    prepare_conversation,
    request_media,
)
from fastdeploy.errors import InvalidArgumentError


class TokenizeRequest(OpenAIBaseModel):
    """`POST /tokenize`: `prompt`, or `messages` with the chat template's settings."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Any] | None = None
    #: default: true for a prompt, false for messages (the template writes them)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str | None] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    """`POST /detokenize`."""

    model: str | None = None
    tokens: list[StrictInt]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str


async def tokenize(ctx: ServingContext, raw: Request) -> Response:
    request = parse_body(TokenizeRequest, await raw.body())
    ctx.model_name(request.model)
    if (request.prompt is None) == (request.messages is None):
        raise invalid_request(
            "send either 'prompt' (a string) or 'messages' (a conversation), not both or neither"
        )
    if request.prompt is not None:
        add_special = request.add_special_tokens is not False
        try:
            tokens = await ctx.offload(ctx.tokenizer.encode, request.prompt, add_special_tokens=add_special)
        except InvalidArgumentError as exc:
            raise invalid_request(str(exc), param="prompt") from exc
    else:
        tokens = await _conversation_tokens(ctx, request)
    token_strs = [ctx.tokenizer.id_to_token(token) for token in tokens] if request.return_token_strs else None
    body = TokenizeResponse(
        count=len(tokens), max_model_len=ctx.max_model_len, tokens=tokens, token_strs=token_strs
    )
    return JSONResponse(body.model_dump())


async def _conversation_tokens(ctx: ServingContext, request: TokenizeRequest) -> list[int]:
    check_request_template(ctx, request.chat_template)
    chat = ChatCompletionRequest(
        messages=request.messages or [],
        chat_template=request.chat_template,
        chat_template_kwargs=request.chat_template_kwargs,
        add_generation_prompt=request.add_generation_prompt,
        tools=request.tools,
        mm_processor_kwargs=request.mm_processor_kwargs,
    )
    plan = plan_chat_tools(None, chat)  # the tools only reach the template
    media = await request_media(ctx, chat)
    if media and request.add_special_tokens:
        raise invalid_request(
            "add_special_tokens cannot be combined with images or videos (their placeholders are "
            "expanded by the model's processor); leave it out",
            param="add_special_tokens",
        )
    prompt = await ctx.offload(prepare_conversation, ctx, chat, plan, media, checked=False)
    if request.add_special_tokens:
        return await ctx.offload(ctx.tokenizer.encode, prompt.text, add_special_tokens=True)
    return prompt.token_ids


async def detokenize(ctx: ServingContext, raw: Request) -> Response:
    request = parse_body(DetokenizeRequest, await raw.body())
    ctx.model_name(request.model)
    vocab = ctx.tokenizer.vocab_size
    for index, token in enumerate(request.tokens):
        if not 0 <= token < vocab:
            raise invalid_request(
                f"tokens[{index}] = {token} is not a token id: ids are in [0, {vocab})", param="tokens"
            )
    text = await ctx.offload(ctx.tokenizer.decode, request.tokens, skip_special_tokens=False)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump())
