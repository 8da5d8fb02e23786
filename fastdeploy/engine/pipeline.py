"""Micro-batches in flight, so that pipeline stages work at the same time.

With the layers split into M stages, a step that waited for its logits would leave M-1 stages
idle. Instead the engine keeps up to M steps in flight: each `step()` schedules a micro-batch of
sequences that are not already in flight and sends it to the ranks, and only once M are under
way (or nothing else can be scheduled) waits for the oldest, samples it and advances its
sequences. Stage 0 then computes micro-batch k+1 while stage 1 computes micro-batch k.
"""

from __future__ import annotations

from typing import Any

from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.stepper import StepCore
from fastdeploy.executor.base import PipelinedExecutor
from fastdeploy.model_executor.batch import ScheduledBatch


class PipelineStepper:
    """Keeps up to `depth` steps of disjoint sequences in flight on a `PipelinedExecutor`."""

    def __init__(self, core: StepCore, executor: PipelinedExecutor, depth: int, in_flight: set[Any]) -> None:
        self.core = core
        self.executor = executor
        self.depth = depth
        #: the sequences of the steps in flight (the scheduler's set: it skips them)
        self.in_flight = in_flight

    @property
    def busy(self) -> bool:
        """Steps are in flight (possibly only of requests aborted since): `step()` must collect them."""
        return self.executor.num_in_flight > 0

    def step(self) -> list[RequestOutput]:
        batch, failed = self.core.schedule_batch()
        in_flight = self.in_flight
        if batch.seqs:
            in_flight.update(batch.seqs)
            self.executor.submit(batch)
            if self.executor.num_in_flight < self.depth:
                return failed
        if not self.executor.num_in_flight:
            return failed
        done, logits, sampling, seconds = self.executor.collect()
        in_flight.difference_update(done.seqs)
        done, logits, sampling = _without_finished(done, logits, sampling)
        if not done.seqs:
            return failed
        return failed + self.core.complete_batch(done, lambda: (logits, sampling, seconds))


def _without_finished(
    batch: ScheduledBatch, logits: Any, sampling: list[int]
) -> tuple[ScheduledBatch, Any, list[int]]:
    """The batch less the sequences aborted while it was in flight (their rows of logits too)."""
    live = [i for i, seq in enumerate(batch.seqs) if not seq.is_finished]
    if len(live) == len(batch.seqs):
        return batch, logits, sampling
    kept = batch.part(live)
    position = {i: new for new, i in enumerate(live)}
    rows = [row for row, i in enumerate(sampling) if i in position]
    new_sampling = [position[sampling[row]] for row in rows]
    return kept, (logits[rows] if logits is not None and rows else None), new_sampling
