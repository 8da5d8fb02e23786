"""The public types of an embedding request: its settings (`PoolingParams`) and its result
(`EmbeddingRequestOutput`, whose `outputs.embedding` is the vector, as in vLLM).

`EmbeddingRequestOutput` has `RequestOutput`'s fields where they mean the same (request id,
prompt, finished, metrics, error code), so code that handles finished requests (the server's
metrics, the async engine) handles both; its `outputs` iterates as one sample that generated no
tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from fastdeploy.engine.request import OK, RequestMetrics


@dataclass
class PoolingParams:
    """How one prompt is embedded.

    `dimensions` cuts the embedding to its first N values (Matryoshka), renormalised when the
    model normalises; only models that declare Matryoshka training take it. `normalize`, when
    set, overrides whether the model's embedding is normalised.
    """

    dimensions: int | None = None
    normalize: bool | None = None


@dataclass
class EmbeddingOutput:
    """The embedding of one prompt."""

    embedding: list[float]
    #: "stop" once pooled; "abort" when the request was stopped first (the embedding is empty)
    finish_reason: str | None = None

    @property
    def token_ids(self) -> list[int]:
        """An embedding generates no tokens."""
        return []

    def __iter__(self) -> Iterator[EmbeddingOutput]:
        return iter((self,))


@dataclass
class EmbeddingRequestOutput:
    """The result of one prompt given to the pooling runner."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    error_code: int = OK
    error_msg: str | None = None


def embedding_error_output(
    request_id: str, prompt: str | None, message: str, arrival_time: float, code: int
) -> EmbeddingRequestOutput:
    """The output of an embedding request that failed before or while its prompt was computed."""
    return EmbeddingRequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=[],
        outputs=EmbeddingOutput([], finish_reason="abort"),
        finished=True,
        metrics=RequestMetrics(arrival_time=arrival_time, model_execute_time=time.time() - arrival_time),
        error_code=code,
        error_msg=message,
    )
