"""`POST /v1/embeddings` (a server started with `--runner pooling`), in OpenAI's shape.

`input` is a string, a list of strings, a token array or a list of token arrays; each becomes one
engine request, batched with everything else in flight. `encoding_format` "float" answers lists
of numbers, "base64" the little-endian float32 bytes in base64 (what OpenAI's SDK asks for by
default and decodes). `dimensions` cuts Matryoshka embeddings (models that declare them only).
`prompt_name` (an extension, as sentence-transformers names it) puts one of the model's named
prompts before each text (as its system message where the checkpoint embeds texts as chat
messages: input/embedding_text.py).
"""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

import numpy as np
from pydantic import field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fastdeploy.engine.pooling_request import PoolingParams
from fastdeploy.entrypoints.openai.errors import invalid_request
from fastdeploy.entrypoints.openai.protocol import OpenAIBaseModel
from fastdeploy.entrypoints.openai.serving import (
    ClientDisconnected,
    PreparedPrompt,
    ServingContext,
    new_id,
    parse_body,
    refuse_aborted,
    request_prompt_items,
    unless_disconnected,
)
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.embedding_text import TextRendering
from fastdeploy.input.prompts import PromptItem


class EmbeddingRequest(OpenAIBaseModel):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    prompt_name: str | None = None

    @field_validator("dimensions", mode="before")
    @classmethod
    def _dimensions(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
        return value


def _prepare(
    ctx: ServingContext, items: list[PromptItem], prompt: str, rendering: TextRendering
) -> list[PreparedPrompt]:
    """Each input's token ids (a text with the model's prompt, rendered as the checkpoint asks),
    checked against the vocabulary and `max_model_len`."""
    prepared = []
    for index, item in enumerate(items):
        try:
            token_ids = ctx.inputs.embedding_token_ids(item, prompt, rendering)
            ctx.inputs.validate(token_ids, generates=False)
        except InvalidArgumentError as exc:
            where = f"input[{index}]: " if len(items) > 1 else ""
            raise invalid_request(where + str(exc), param="input") from exc
        prepared.append(PreparedPrompt(token_ids, item.text or ""))
    return prepared


def _encoded(embedding: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(embedding, dtype="<f4").tobytes()).decode("ascii")
    return embedding


async def create_embedding(ctx: ServingContext, raw: Request) -> Response:
    request = parse_body(EmbeddingRequest, await raw.body())
    model = ctx.model_name(request.model)
    params = PoolingParams(dimensions=request.dimensions)
    engine = ctx.engine.engine
    try:
        engine.validate_params(params)
    except InvalidArgumentError as exc:
        raise invalid_request(str(exc), param="dimensions") from exc
    try:
        prompt = engine.pooling.prompt(request.prompt_name)
    except InvalidArgumentError as exc:
        raise invalid_request(str(exc), param="prompt_name") from exc
    items = request_prompt_items(request.input, "input")
    ctx.admit(len(items))
    prompts = await ctx.offload(_prepare, ctx, items, prompt, engine.pooling.rendering)
    ctx.admit(len(prompts))  # again: the queue may have filled while they were tokenized
    request_id = new_id("embd")
    try:
        outputs = await unless_disconnected(ctx.final_outputs(request_id, prompts, params), raw)  # type: ignore[arg-type]
    except ClientDisconnected:
        return Response(status_code=499)
    refuse_aborted(outputs)
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": _encoded(output.outputs.embedding, request.encoding_format),
        }
        for index, output in enumerate(outputs)
    ]
    prompt_tokens = sum(len(prompt.token_ids) for prompt in prompts)
    body = {
        "id": request_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    return JSONResponse(body)
