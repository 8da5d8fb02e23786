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
and runs as usual. Placeholders live only inside `AsyncStepper.step`: between steps every token
a sequence holds is real, and that is what outputs, prefix-cache keys and aborts read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend, BatchLayout, PendingTokens
from fastdeploy.engine.fault_isolation import describe
from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.request_ends import RequestEnds
from fastdeploy.engine.sampling_rules import overlappable
from fastdeploy.engine.sequence import Sequence, SequenceStatus
from fastdeploy.engine.stepper import StepCore
from fastdeploy.errors import EngineDeadError
from fastdeploy.executor.base import Executor
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch

logger = get_logger(__name__)

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


def overlappable_batch(batch: ScheduledBatch, reasoning_budget_applies: bool) -> bool:
    """Whether every sequence of `batch` can take its next token from the device's argmax
    (`sampling_rules.overlappable`) and has no extra (multimodal) inputs."""
    distinct_params = {id(seq.params): seq.params for seq in batch.seqs}.values()
    return all(overlappable(params, reasoning_budget_applies) for params in distinct_params) and all(
        seq.extra_inputs is None for seq in batch.seqs
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


class AsyncStepper:
    """Launch this step's pass, then read the last step's tokens; a batch that cannot overlap
    (`overlappable` is False) waits for the pass in flight and runs as `SyncStepper` runs it."""

    def __init__(
        self,
        core: StepCore,
        executor: Executor,
        overlappable: Callable[[ScheduledBatch], bool],
        ends: RequestEnds,
    ) -> None:
        self.core = core
        self.executor = executor
        self.overlappable = overlappable
        #: ends the requests whose device-sampled rows were broken
        self.ends = ends
        #: the pass launched by the last step whose tokens the host has not read yet
        self.in_flight: InFlightPass | None = None

    @property
    def busy(self) -> bool:
        return self.in_flight is not None

    def step(self) -> list[RequestOutput]:
        flight, self.in_flight = self.in_flight, None
        if flight is not None:
            expect_next_tokens(flight, self.core.max_model_len)
        batch, outputs = self.core.schedule_batch()
        if batch.seqs and self.overlappable(batch):
            try:
                launched = self._launch(batch, flight)
            except EngineDeadError:
                raise
            except Exception as exc:  # run again below, where fault isolation finds the culprits
                logger.warning("an overlapped pass failed to launch (%s); running it in step", describe(exc))
            else:
                self.in_flight = launched
                return outputs + (self._land(flight) if flight is not None else [])
        if flight is not None:
            outputs += self._land(flight)
            batch = batch.part(i for i, seq in enumerate(batch.seqs) if not seq.is_finished)
        if not batch.seqs:
            return outputs
        executor = self.executor
        return outputs + self.core.complete_batch(batch, lambda: executor.execute(batch), executor.execute)

    def _launch(self, batch: ScheduledBatch, flight: InFlightPass | None) -> InFlightPass:
        """Queue `batch`'s pass and its greedy tokens on the device; its sequences count the
        tokens as computed (the next step schedules them on), the host reads them next step."""
        backend = self.core.backend
        feed = placeholder_feed(backend, batch, flight)
        logits, sampling, seconds = self.executor.execute(batch, feed)
        if batch.sampling is not None and batch.sampling.tokens is not None:  # sampled in the pass
            tokens = batch.sampling.tokens
        else:
            tokens = backend.greedy_tokens(logits) if sampling else None
        for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += count
        return InFlightPass(batch, [batch.seqs[index] for index in sampling], tokens, seconds)

    def _land(self, flight: InFlightPass) -> list[RequestOutput]:
        """Read `flight`'s tokens into its sequences, as `complete_batch` does after a pass; rows
        with broken logits fail their requests, rows of sequences that ended meanwhile are dropped."""
        drop_placeholders(flight.sampled)
        tokens, broken = flight.tokens.wait() if flight.tokens is not None else ([], [])
        requests, faults = self.ends.requests, self.ends.fault_isolation
        failed = {
            seq.request_id
            for seq, bad in zip(flight.sampled, broken, strict=True)
            if bad and seq.request_id in requests
        }
        outputs = self.ends.fail([faults.nonfinite(request_id) for request_id in failed])
        if failed and len(failed) == len({seq.request_id for seq in flight.sampled}):
            faults.check_device()  # every request of the pass failed: is the device lost?
        for seq in flight.batch.seqs:
            if seq.status is SequenceStatus.RUNNING:
                seq.forward_time += flight.forward_seconds
                self.core.block_manager.register_full_blocks(seq)
        live = [
            (seq, (int(token),))
            for seq, token in zip(flight.sampled, tokens, strict=True)
            if not seq.is_finished and seq.request_id in requests
        ]
        return outputs + self.core.emit([seq for seq, _ in live], [token for _, token in live])
