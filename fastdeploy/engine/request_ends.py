"""How requests leave the engine: aborted, failed by a fault, refused, or with their output.

Every way out frees the request's KV blocks (its samples are finished in the scheduler), builds
its last output, and releases what the features and the media processor hold for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastdeploy.engine.fault_isolation import (
    GUIDED_DECODING_CONFLICT,
    OUTPUT_PROCESSING,
    FaultIsolation,
    RequestFault,
    describe,
)
from fastdeploy.engine.output_processor import OutputProcessor, fault_output
from fastdeploy.engine.request import INVALID_REQUEST, RequestOutput
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.sequence import EngineRequest, Sequence


class RequestEnds:
    """Ends requests of the engine's `requests` table."""

    def __init__(
        self,
        requests: dict[str, EngineRequest],
        scheduler: Scheduler,
        output_processor: OutputProcessor,
        fault_isolation: FaultIsolation,
        releases: list[Callable[[str, list[Sequence]], None]],
    ) -> None:
        self.requests = requests
        self.scheduler = scheduler
        self.output_processor = output_processor
        self.fault_isolation = fault_isolation
        #: the features' `release` hooks
        self.releases = releases

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now, free its KV blocks, and return its final output (None if unknown)."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        self.finish_all(request)
        output = self.output_or_fault(request)
        self.drop(request)
        return output

    def finish_all(self, request: EngineRequest) -> None:
        """Stop every unfinished sample of `request` ("abort") and free its KV blocks."""
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                seq.finish_time = time.time()
                self.scheduler.finish(seq)

    def drop(self, request: EngineRequest) -> None:
        """The request leaves the engine: its encoder outputs and the features' state go."""
        self.requests.pop(request.request_id, None)
        if request.multimodal is not None:
            request.multimodal.release_encoder_outputs()
        for release in self.releases:
            release(request.request_id, request.seqs)

    def fail(self, faults: list[RequestFault]) -> list[RequestOutput]:
        """End each faulted request (KV blocks freed) with an error output naming the fault."""
        outputs = []
        for fault in faults:
            request = self.requests.get(fault.request_id)
            if request is not None:
                self.finish_all(request)
                outputs.append(fault_output(request, fault.message))
                self.drop(request)
        return outputs

    def refuse(self, refused: dict[str, str]) -> list[RequestOutput]:
        """End each refused request (request id -> why) with error_code 400 and its tokens so far."""
        outputs = []
        for request_id, why in sorted(refused.items()):
            self.fault_isolation.record(request_id, GUIDED_DECODING_CONFLICT, why)
            output = self.abort(request_id)
            if output is not None:
                output.error_code = INVALID_REQUEST
                output.error_msg = why
                outputs.append(output)
        return outputs

    def output_or_fault(self, request: EngineRequest) -> RequestOutput:
        """The request's output, or, when a plugin fails while building it (a reasoning parser
        that raises), an error output for this request alone, whose samples are then stopped."""
        try:
            return self.output_processor.request_output(request)
        except Exception as exc:
            fault = self.fault_isolation.record(
                request.request_id, OUTPUT_PROCESSING, f"building the output failed: {describe(exc)}"
            )
            self.finish_all(request)
            return fault_output(request, fault.message)
