"""How a step drives the executor: one `Stepper` interface, chosen once when the engine is built.

- `SyncStepper` (here): schedule, run the pass, update; the usual mode.
- `AsyncStepper` (`engine/async_scheduling.py`): launch pass N+1 before reading pass N's tokens.
- `PipelineStepper` (`engine/pipeline.py`): keep a micro-batch per pipeline stage in flight.

A stepper reaches the engine only through `StepCore`: it asks for the next batch and hands a
pass's results back for the update. `executor` is the stepper's to use (tests and benchmarks
swap it through `LLMEngine.runner`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fastdeploy.backends.base import Backend
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.sequence import Sequence
from fastdeploy.executor.base import Executor, PassOutput
from fastdeploy.model_executor.batch import ScheduledBatch


class StepCore(Protocol):
    """What a stepper needs of the engine: the schedule and the update halves of a step."""

    backend: Backend
    block_manager: BlockManager
    max_model_len: int

    def schedule_batch(self) -> tuple[ScheduledBatch, list[RequestOutput]]:
        """The next batch, and the failed outputs of the requests it could not allocate."""

    def complete_batch(
        self,
        batch: ScheduledBatch,
        forward: Callable[[], PassOutput],
        forward_part: Callable[[ScheduledBatch], PassOutput] | None = None,
    ) -> list[RequestOutput]:
        """Run `forward` (isolating faults with `forward_part`), sample, and update the batch."""

    def emit(
        self, sampled: list[Sequence], emitted: list[tuple[int, ...]], refused: dict[str, str] | None = None
    ) -> list[RequestOutput]:
        """Append tokens sampled elsewhere (on the device: async scheduling) and build outputs."""


class Stepper(Protocol):
    executor: Executor

    @property
    def busy(self) -> bool:
        """Passes are in flight, to be collected by later steps."""

    def step(self) -> list[RequestOutput]:
        """Advance the engine by one step; the outputs of the requests it finished or streams."""


class SyncStepper:
    """Schedule -> execute -> update, one pass at a time."""

    busy = False

    def __init__(self, core: StepCore, executor: Executor) -> None:
        self.core = core
        self.executor = executor

    def step(self) -> list[RequestOutput]:
        batch, failed = self.core.schedule_batch()
        if not batch.seqs:
            return failed
        executor = self.executor
        return failed + self.core.complete_batch(batch, lambda: executor.execute(batch), executor.execute)
