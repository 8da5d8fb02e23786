"""The executor interface: what the engine's stepper runs a scheduled batch on.

Two implementations: `LocalExecutor` (`executor/local.py`, the model in the engine's process) and
`DistributedExecutor` (`executor/rank_executor.py`, the model on rank processes). The engine
holds one and never asks which: it executes batches, probes the device after a pass every
request of which failed, checks health between steps and shuts the executor down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fastdeploy.backends.base import BatchLayout
from fastdeploy.model_executor.batch import ScheduledBatch

#: what a pass hands back: (logits [sampling rows + extra rows, vocab] or None, the batch
#: indices of the sequences that sample, forward seconds)
PassOutput = tuple[Any, list[int], float]


class Executor(Protocol):
    """Runs batches of the engine's sequences through the model."""

    #: KV block size of the cache the batches' block tables index
    block_size: int

    def execute(self, batch: ScheduledBatch, feed: Callable[[BatchLayout], Any] | None = None) -> PassOutput:
        """Run one pass. `feed`, given, turns the layout into the pass's device input ids (async
        scheduling: some inputs are tokens still being sampled on the device)."""

    #: the logits of a one-token pass on a scratch KV cache (raises if the device cannot run it);
    #: None where there is nothing to probe here (rank processes report their own death)
    probe: Callable[[], Any] | None

    def check_health(self) -> None:
        """Raise if the executor can no longer run passes (a rank process died)."""

    def shutdown(self) -> None:
        """Release what the executor started (rank processes)."""


class PipelinedExecutor(Executor, Protocol):
    """An executor that keeps several passes in flight (pipeline stages working at once)."""

    @property
    def num_in_flight(self) -> int: ...

    def submit(self, batch: ScheduledBatch) -> None:
        """Start a pass without waiting for it."""

    def collect(self) -> tuple[ScheduledBatch, Any, list[int], float]:
        """Wait for the oldest submitted pass: (its batch, logits or None, sampling indices, seconds)."""
