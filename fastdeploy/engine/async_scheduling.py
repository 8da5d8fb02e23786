"""Async scheduling: step N+1 is scheduled and launched before step N's tokens reach the host.

On an accelerator a decode step is host work (scheduling, the batch layout, turning tokens into
text, stop checks, outputs) and device work; one after the other, the device idles while the
host works. With async scheduling (vLLM's name for it) the engine launches pass N+1 while pass N
is still computing, and reads N's tokens after that:

- every sequence that samples in pass N and still runs gets a placeholder token (`PLACEHOLDER`)
  before scheduling, so the scheduler and the batch layout see it one token longer, as they will
  once N's token arrives. A sequence that N's token ends by length gets none: it is not
  scheduled again.
- Pass N+1 reads those inputs from N's tokens on the device (`Backend.feed_tokens`).
- Then N's tokens come to the host (`PendingTokens.wait`), replace the placeholders and go
  through the usual token processing.
  - A sequence that N's token finished (EOS, a stop string) had a row in N+1 whose token is
    dropped.
  - That row's KV write goes to blocks freed after the pass was queued. The device runs passes
    in order, so a later owner of the blocks writes after it.

Only greedy rows that need nothing from the host before their next token overlap; penalties,
bans, guided decoding, logprobs and beams all do. Any other batch waits for the pass in flight
and runs as usual. Placeholders live only inside `LLMEngine.step`: between steps every token a
sequence holds is real, and that is what outputs, prefix-cache keys and aborts read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend, BatchLayout, PendingTokens
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import ScheduledBatch
from fastdeploy.engine.sequence import Sequence, SequenceStatus

#: the token id a sequence holds for a token still being sampled on the device (never a real id)
PLACEHOLDER = -1


@dataclass
class InFlightPass:
    """A launched pass whose tokens the host has not read yet."""

    batch: ScheduledBatch
    #: the sequences that sample in it, in the order of its token rows
    sampled: list[Sequence]
    #: its greedy tokens (None when no sequence samples: every one was mid-prompt)
    tokens: PendingTokens | None
    forward_seconds: float


def greedy_without_extras(params: SamplingParams) -> bool:
    """Greedy rows that need nothing but the argmax (which the backend takes on the device)."""
    return (
        params.greedy
        and params.repetition_penalty == 1.0
        and not params.frequency_penalty
        and not params.presence_penalty
        and params.logprobs is None
    )


def overlappable(params: SamplingParams, reasoning_budget_applies: bool) -> bool:
    """Whether a sequence's next token is known once its argmax is: nothing the host does
    between passes (bans, grammar masks, beam choices, a forced end of thinking, prompt
    scoring) can change it."""
    return (
        greedy_without_extras(params)
        and not params.min_tokens
        and not params.bad_words
        and not params.guided_decoding
        and not params.use_beam_search
        and params.prompt_logprobs is None
        and not (reasoning_budget_applies and params.reasoning_max_tokens is not None)
    )


def expect_next_tokens(flight: InFlightPass, max_model_len: int) -> None:
    """A placeholder for the token each running sequence of `flight` is getting, unless that
    token ends it by length (the checks `process_token` makes once the token is appended)."""
    for seq in flight.sampled:
        if seq.status is not SequenceStatus.RUNNING:
            continue  # finished, aborted or failed since the launch
        length = len(seq.token_ids) + 1
        if length - len(seq.prompt_token_ids) >= seq.max_output_tokens or length >= max_model_len:
            continue
        seq.token_ids.append(PLACEHOLDER)


def placeholder_feed(
    backend: Backend, batch: ScheduledBatch, flight: InFlightPass | None
) -> Callable[[BatchLayout], Any] | None:
    """What turns `batch`'s layout into device input ids, placeholders taken from `flight`'s
    tokens (None when no sequence of `batch` waits for one).

    A sequence holding a placeholder computes exactly that token in `batch` (it decodes one), so
    the placeholder rows of the layout are its sequences' rows in batch order.
    """
    if flight is None or flight.tokens is None:
        return None
    row_of = {id(seq): row for row, seq in enumerate(flight.sampled)}
    sources = [row_of[id(seq)] for seq in batch.seqs if seq.token_ids[-1] == PLACEHOLDER]
    if not sources:
        return None
    tokens = flight.tokens

    def feed(layout: BatchLayout) -> Any:
        rows = np.flatnonzero(layout.input_ids == PLACEHOLDER)
        return backend.feed_tokens(layout.input_ids, rows, tokens, np.array(sources, dtype=np.int64))

    return feed


def drop_placeholders(seqs: list[Sequence]) -> None:
    """Take back the placeholders of `seqs` (their real tokens are about to be appended)."""
    for seq in seqs:
        if seq.token_ids[-1] == PLACEHOLDER:
            seq.token_ids.pop()
