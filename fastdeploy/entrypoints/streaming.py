"""Turns the engine's cumulative streamed outputs into deltas (what is new since the last one).

The engine reports, after each step, a sample's whole text, reasoning and token ids so far. A
streaming client wants only the new part. `DeltaTracker` remembers what each sample has already
sent; the server's SSE responses and the `chat` command share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastdeploy.engine.request import CompletionOutput
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


@dataclass
class SampleDelta:
    """What one sample added since the previous update."""

    index: int
    text: str = ""
    reasoning_content: str = ""
    token_ids: list[int] = field(default_factory=list)
    #: {token_id: logprob} for each token of `token_ids`, when logprobs were requested
    logprobs: list[dict[int, float]] | None = None
    #: set on the one update where the sample finishes
    finish_reason: str | None = None


@dataclass
class _Sent:
    text: str = ""
    reasoning_content: str = ""
    num_tokens: int = 0
    finished: bool = False


def _suffix(old: str, new: str, what: str) -> str:
    if new.startswith(old):
        return new[len(old) :]
    # Parsers and stop-string handling only ever extend what they showed; if one does not, send
    # the part past the common prefix rather than repeat text the client already has.
    common = 0
    for a, b in zip(old, new, strict=False):
        if a != b:
            break
        common += 1
    logger.warning("streamed %s changed after it was sent; sending only the new tail", what)
    return new[max(common, len(old)) :]


class DeltaTracker:
    """Per-sample memory of what has been streamed."""

    def __init__(self) -> None:
        self._sent: dict[int, _Sent] = {}

    def update(self, sample: CompletionOutput) -> SampleDelta:
        """The delta of `sample` (a cumulative output) since the last update of the same index."""
        sent = self._sent.setdefault(sample.index, _Sent())
        delta = SampleDelta(index=sample.index)
        delta.text = _suffix(sent.text, sample.text, "text")
        reasoning = sample.reasoning_content or ""
        delta.reasoning_content = _suffix(sent.reasoning_content, reasoning, "reasoning")
        delta.token_ids = list(sample.token_ids[sent.num_tokens :])
        if sample.logprobs is not None:
            delta.logprobs = sample.logprobs[sent.num_tokens : len(sample.token_ids)]
        if sample.finish_reason is not None and not sent.finished:
            delta.finish_reason = sample.finish_reason
            sent.finished = True
        sent.text, sent.reasoning_content = sample.text, reasoning
        sent.num_tokens = len(sample.token_ids)
        return delta
