"""Fault isolation: a failure inside the engine fails only the requests it belongs to.

A batched forward pass mixes every running request, so one bad request (a prompt that trips a
plugin op, a sequence whose logits turn NaN) would take the whole batch down with it. When a
pass fails, `FaultIsolation.run_pass` runs each of its sequences again alone: the sequences that
fail alone fail their requests, the others go on with the tokens of their solo pass (the same
tokens the batched pass would have given: the kernels are batch-invariant). The retry costs one
pass per sequence, and only after a failure.

Rows of logits that cannot be sampled from (NaN, +inf, or all -inf) are a failure of the pass
too (`NonFiniteLogitsError`), so they are isolated the same way instead of being sampled into
garbage tokens.

When every sequence of a pass fails alone (raising, or with broken logits), the device itself may
be broken. A one-token probe pass on a scratch KV block (allocated on first need, so nothing is reserved while all is well)
tells the two apart: if the probe fails too, `EngineDeadError` is raised and the caller (the
server) stops. A backend can raise `EngineDeadError` from any op to declare its device lost.

Every failure is recorded as a `RequestFault` with a kind (`FORWARD_ERROR`, `NONFINITE_LOGITS`,
`KV_ALLOCATION`, `OUTPUT_PROCESSING`, and `GUIDED_DECODING_CONFLICT` for the requests a pass
refuses); `faults_in_step` holds those of the latest step (the server's metrics count them by
kind, and its error responses carry the kind as `code`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.engine.pass_logits import PassLogits
from fastdeploy.engine.sequence import Sequence
from fastdeploy.engine.step_feature import StepFeature
from fastdeploy.errors import EngineDeadError
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch

logger = get_logger(__name__)

#: an op of the forward pass (or the sampler) raised
FORWARD_ERROR = "forward_error"
#: the request's logits held NaN or +inf, or only -inf
NONFINITE_LOGITS = "nonfinite_logits"
#: KV blocks could not be allocated for the request
KV_ALLOCATION = "kv_allocation"
#: turning the request's tokens into its output failed (e.g. a reasoning parser raised)
OUTPUT_PROCESSING = "output_processing"
#: the request's bans leave no token its guided-decoding grammar allows (a 400, not a fault of
#: the engine: see `engine/guided/conflicts.py`)
GUIDED_DECODING_CONFLICT = "guided_decoding_conflict"

#: what a sampled pass gives: (sequences that emit tokens, the tokens each emits (a tuple: one
#: token, or a speculative run of verified drafts), forward seconds, the requests it refuses:
#: request id -> why)
SampledPass = tuple[list[Sequence], list[tuple[int, ...]], float, dict[str, str]]
#: a sampled pass over any part of a batch
PartPass = Callable[[ScheduledBatch], SampledPass]


class NonFiniteLogitsError(RuntimeError):
    """Some rows of a pass's logits cannot be sampled from; `rows` index the sampling sequences."""

    def __init__(self, rows: list[int]) -> None:
        super().__init__(f"the model produced NaN or infinite logits (rows {rows})")
        self.rows = rows


def check_logits(backend: Backend, logits: Any) -> None:
    """Raise `NonFiniteLogitsError` if any row of `logits` is broken (see `Backend.nonfinite_rows`)."""
    broken = np.flatnonzero(np.asarray(backend.nonfinite_rows(logits)))
    if broken.size:
        raise NonFiniteLogitsError(broken.tolist())


@dataclass(frozen=True)
class RequestFault:
    """Why one request failed inside the engine."""

    request_id: str
    kind: str
    message: str


@dataclass
class PassResult:
    """What survived a pass: the sequences that ran, those that emit tokens and the tokens each
    emits, the requests refused after sampling (request id -> why), and the faults."""

    batch: ScheduledBatch
    sampled: list[Sequence] = field(default_factory=list)
    tokens: list[tuple[int, ...]] = field(default_factory=list)
    forward_seconds: float = 0.0
    refused: dict[str, str] = field(default_factory=dict)
    faults: list[RequestFault] = field(default_factory=list)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def without_requests(batch: ScheduledBatch, request_ids: Collection[str]) -> ScheduledBatch:
    """`batch` less the sequences of `request_ids` (`batch` itself when there are none)."""
    if not request_ids:
        return batch
    return batch.part(index for index, seq in enumerate(batch.seqs) if seq.request_id not in request_ids)


class FaultIsolation(StepFeature):
    """The engine's record of request faults, its isolating pass runner and its device probe.

    As a step feature it starts each step's record and checks every pass's logits before any
    other feature reads them. `probe` (`Executor.probe`) returns the logits of a one-token pass
    on a scratch KV cache, raising if it fails; None where there is nothing to probe locally
    (rank processes report their own death with `WorkerFailedError`).
    """

    def __init__(self, backend: Backend, probe: Callable[[], Any] | None) -> None:
        self._backend = backend
        self._probe = probe
        self.faults_in_step: list[RequestFault] = []

    def before_schedule(self, running: list[Sequence]) -> None:
        self.faults_in_step = []

    def read_logits(self, logits: PassLogits, batch: ScheduledBatch) -> None:
        """The model's own logits (every row: sampled, scored and verified), before any mask."""
        check_logits(self._backend, logits.logits)

    def record(self, request_id: str, kind: str, message: str) -> RequestFault:
        fault = RequestFault(request_id, kind, message)
        self.faults_in_step.append(fault)
        logger.error("request %s failed (%s): %s", request_id, kind, message)
        return fault

    def allocation_faults(self, batch: ScheduledBatch) -> list[RequestFault]:
        """Faults of the sequences the scheduler could not allocate KV blocks for."""
        return [
            self.record(seq.request_id, KV_ALLOCATION, f"KV blocks could not be allocated: {describe(exc)}")
            for seq, exc in batch.failed
        ]

    def run_pass(
        self, batch: ScheduledBatch, forward: Callable[[], SampledPass], forward_part: PartPass | None
    ) -> PassResult:
        """`forward()` (the whole batch); if it fails, `forward_part` on each sequence alone, failing
        only the requests whose sequences fail alone (all of them without `forward_part`)."""
        try:
            return PassResult(batch, *forward())
        except EngineDeadError:
            raise
        except Exception as exc:
            failure = exc
        if len(batch) > 1 and forward_part is not None:
            logger.warning(
                "a pass over %d sequences failed (%s); running each alone to find the failing ones",
                len(batch),
                describe(failure),
                exc_info=failure,
            )
            result, failures = self._solo_passes(batch, forward_part)
        else:
            logger.warning("a pass failed: %s", describe(failure), exc_info=failure)
            result = PassResult(ScheduledBatch())
            failures = {seq.request_id: failure for seq in batch.seqs}
        if not result.batch.seqs:
            self.check_device()
        result.faults = [self._fault(request_id, exc) for request_id, exc in failures.items()]
        return result

    @staticmethod
    def _solo_passes(
        batch: ScheduledBatch, forward_part: PartPass
    ) -> tuple[PassResult, dict[str, BaseException]]:
        """Each sequence of `batch` in a pass of its own; a request fails with its first failing sample."""
        result = PassResult(ScheduledBatch())
        failures: dict[str, BaseException] = {}
        for index, (seq, count) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            if seq.request_id in failures:
                continue
            alone = batch.part([index])
            try:
                sampled, tokens, seconds, refused = forward_part(alone)
            except EngineDeadError:
                raise
            except Exception as exc:
                failures[seq.request_id] = exc
                continue
            result.batch.add(seq, count)
            result.sampled += sampled
            result.tokens += tokens
            result.forward_seconds += seconds
            result.refused.update(refused)
        # the other samples (n > 1) of a failed request go too
        result.batch = without_requests(result.batch, failures)
        kept = [
            (s, t) for s, t in zip(result.sampled, result.tokens, strict=True) if s.request_id not in failures
        ]
        result.sampled, result.tokens = [s for s, _ in kept], [t for _, t in kept]
        result.refused = {
            request_id: why for request_id, why in result.refused.items() if request_id not in failures
        }
        return result, failures

    def _fault(self, request_id: str, exc: BaseException) -> RequestFault:
        if isinstance(exc, NonFiniteLogitsError):
            return self.nonfinite(request_id)
        return self.record(request_id, FORWARD_ERROR, f"the forward pass failed: {describe(exc)}")

    def nonfinite(self, request_id: str) -> RequestFault:
        """The fault of a request whose logits row held NaN or +inf, or only -inf."""
        return self.record(request_id, NONFINITE_LOGITS, "the model produced NaN or infinite logits")

    def check_device(self) -> None:
        """Raise `EngineDeadError` unless a one-token probe pass still works (when there is a probe)."""
        if self._probe is None:
            return
        try:
            check_logits(self._backend, self._probe())
        except Exception as exc:
            raise EngineDeadError(
                f"every request of a pass failed and a one-token probe pass failed too ({describe(exc)}); "
                "the device cannot run the model any more"
            ) from exc
        logger.info("probe pass succeeded: the device works, only the failed requests were at fault")
