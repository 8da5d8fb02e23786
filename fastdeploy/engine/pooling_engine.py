"""The pooling runner's engine (`runner="pooling"`): prompts in, embeddings out.

A request is one prompt pass: no sampling, no decode. The engine keeps the parts of generation
that still apply and nothing else: the scheduler batches prompts under the token budget (a long
prompt is computed in chunks, KV blocks hold its earlier chunks) and preempts when blocks run
out; fault isolation runs a failed pass again per sequence so that one bad request fails alone.
Each pass hands back, per sequence, what its chunk gives the pooling (`ModelRunner.pool`); a
sequence whose last prompt token was computed becomes an `EmbeddingRequestOutput`.

It has `LLMEngine`'s request interface (`add_request`, `step`, `abort_request`,
`has_unfinished_requests`), so `AsyncLLMEngine` serves it unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fastdeploy.config import EngineConfig
from fastdeploy.engine import builder
from fastdeploy.engine.fault_isolation import FaultIsolation, RequestFault, SampledPass, without_requests
from fastdeploy.engine.pooling_request import (
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingParams,
    embedding_error_output,
)
from fastdeploy.engine.request import INTERNAL_ERROR, RequestMetrics
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.sequence import Sequence
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.processor import InputProcessor
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.pooling import (
    PoolingSpec,
    finish_embedding,
    pooling_checkpoint,
    read_pooling_spec,
)

logger = get_logger(__name__)

#: what a `Sequence` must carry though nothing samples from it
_NO_SAMPLING = SamplingParams(max_tokens=1)
_NO_RNG = np.random.default_rng(0)


class PoolingExecutor(Protocol):
    """What the engine runs passes on (`LocalExecutor`: `ModelRunner.pool`)."""

    def pool(self, batch: ScheduledBatch, pooling_type: str) -> tuple[np.ndarray, float]: ...

    def probe(self) -> Any: ...


@dataclass
class _Embedding:
    """One request in the engine: its sequence, settings and what its chunks pooled so far."""

    seq: Sequence
    params: PoolingParams
    prompt: str | None
    arrival_time: float
    #: LAST and CLS: the row so far; MEAN: the sum of the rows so far
    pooled: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))

    def add(self, chunk: np.ndarray, start: int, pooling_type: str) -> None:
        """Fold in what a chunk that began at prompt position `start` gave (0: the prompt is
        computed afresh, the first time or after a preemption)."""
        if start == 0 or pooling_type == "LAST":
            self.pooled = chunk.copy()
        elif pooling_type == "MEAN":
            self.pooled = self.pooled + chunk
        # CLS: only the chunk at position 0 holds the first token


class PoolingEngine:
    """Owns the backend, model, tokenizer, KV cache and scheduler; `step()` embeds prompts."""

    def __init__(self, config: EngineConfig) -> None:
        if config.runner != "pooling":
            raise InvalidArgumentError(f"PoolingEngine needs runner='pooling', got {config.runner!r}")
        self.config = config
        setup = builder.prepare(config)
        checkpoint = pooling_checkpoint(setup.checkpoint, setup.registry.model_architectures())
        setup = dataclasses.replace(setup, checkpoint=checkpoint, model_config=checkpoint.config)
        self.backend, self.model_config = setup.backend, setup.model_config
        self.generation_defaults: dict[str, Any] = {}
        self.max_model_len, self.max_num_batched_tokens = setup.max_model_len, setup.max_num_batched_tokens
        self.input_processor = InputProcessor.load(
            config, setup.registry, setup.model_path, self.model_config, self.max_model_len
        )
        self.tokenizer = self.input_processor.tokenizer
        #: the pooling, normalisation, Matryoshka sizes, prompts and text rendering of this model
        self.pooling: PoolingSpec = read_pooling_spec(
            setup.model_path, checkpoint.config, config.pooler_config, self.tokenizer.chat_template
        )
        loaded = builder.load_model(config, setup, self.input_processor)
        self._runner: PoolingExecutor = loaded.executor  # type: ignore[assignment]
        # a mean or first-token pooling reads every prompt position, so none may come from the cache
        caching = config.enable_prefix_caching and self.pooling.pooling_type == "LAST"
        manager = loaded.block_manager
        self.block_manager = manager.empty_copy(caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, self.max_num_batched_tokens)
        self.fault_isolation = FaultIsolation(self.backend, self._runner.probe)
        self.requests: dict[str, _Embedding] = {}
        self._seq_ids = 0
        logger.info(
            "pooling engine ready: %s, %s pooling%s, max_model_len %d",
            self.model_config.architecture,
            self.pooling.pooling_type,
            ", normalised" if self.pooling.normalize else "",
            self.max_model_len,
        )

    # --- requests ---------------------------------------------------------------------------
    def validate_params(self, params: PoolingParams) -> None:
        """Raise InvalidArgumentError if this model rules out `params` (a `dimensions` it was not
        trained for)."""
        if not isinstance(params, PoolingParams):
            raise InvalidArgumentError(
                f"runner='pooling' takes PoolingParams, got {type(params).__name__} (generation needs "
                "runner='generate')"
            )
        if params.normalize is not None and not isinstance(params.normalize, bool):
            raise InvalidArgumentError(f"normalize must be a bool or None, got {params.normalize!r}")
        self.pooling.check_dimensions(params.dimensions)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: PoolingParams,
        prompt: str | None = None,
        arrival_time: float | None = None,
        stream: bool = False,
        thinking_enabled: bool = True,
        multimodal: Any = None,
        lora_request: Any = None,
    ) -> None:
        """Queue a prompt to embed; raises InvalidArgumentError (nothing queued) if it cannot be.
        `stream` and `thinking_enabled` are `LLMEngine`'s and change nothing here."""
        if request_id in self.requests:
            raise InvalidArgumentError(f"request_id {request_id!r} is already in use")
        if multimodal is not None:
            raise InvalidArgumentError("runner='pooling' embeds text and token ids; media are not supported")
        if lora_request is not None:
            raise InvalidArgumentError("runner='pooling' runs no LoRA adapters")
        self.validate_params(params)
        self.input_processor.validate(prompt_token_ids, generates=False)
        arrival = time.time() if arrival_time is None else arrival_time
        self._seq_ids += 1
        seq = Sequence(
            self._seq_ids, request_id, 0, list(prompt_token_ids), _NO_SAMPLING, 0, _NO_RNG, arrival
        )
        self.requests[request_id] = _Embedding(seq, params, prompt, arrival)
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> EmbeddingRequestOutput | None:
        """Stop a request now, free its KV blocks, and return its final output (None if unknown)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        self.scheduler.finish(request.seq)
        return self._output(request, EmbeddingOutput([], finish_reason="abort"))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def check_health(self) -> None:
        """Nothing to check: the model runs in this process."""
        return None

    def shutdown(self) -> None:
        """Nothing to stop: the model runs in this process."""
        return None

    # --- stepping -----------------------------------------------------------------------------
    def step(self) -> list[EmbeddingRequestOutput]:
        """Run one pass over the scheduled prompt chunks; the outputs of the prompts it finished
        (and of those that failed: `error_code` 500, the others unaffected)."""
        self.fault_isolation.before_schedule([])
        batch = self.scheduler.schedule()
        outputs = self._fail(self.fault_isolation.allocation_faults(batch))
        batch = without_requests(batch, {output.request_id for output in outputs})
        if not batch.seqs:
            return outputs
        pooled: dict[Sequence, np.ndarray] = {}
        result = self.fault_isolation.run_pass(
            batch, lambda: self._pass(batch, pooled), lambda part: self._pass(part, pooled)
        )
        outputs += self._fail(result.faults)
        pooling_type = self.pooling.pooling_type
        for seq, count in zip(result.batch.seqs, result.batch.num_new_tokens, strict=True):
            request = self.requests[seq.request_id]
            request.add(pooled[seq], seq.num_computed_tokens, pooling_type)
            seq.num_computed_tokens += count
            seq.forward_time += result.forward_seconds
            self.block_manager.register_full_blocks(seq)
            if seq.num_computed_tokens == seq.num_tokens:
                outputs.append(self._finish(request))
        return outputs

    def _pass(self, batch: ScheduledBatch, pooled: dict[Sequence, np.ndarray]) -> SampledPass:
        """One pass over `batch` (fault isolation's unit), its chunks' pooled rows put in `pooled`."""
        rows, seconds = self._runner.pool(batch, self.pooling.pooling_type)
        if not np.isfinite(rows).all():
            broken = np.flatnonzero(~np.isfinite(rows).all(axis=1)).tolist()
            raise FloatingPointError(f"the model produced NaN or infinite hidden states (rows {broken})")
        pooled.update(zip(batch.seqs, rows, strict=True))
        return [], [], seconds, {}

    def _finish(self, request: _Embedding) -> EmbeddingRequestOutput:
        """The finished request's output; its KV blocks are freed."""
        seq, params = request.seq, request.params
        del self.requests[seq.request_id]
        seq.finish_time = time.time()
        self.scheduler.finish(seq)
        spec = self.pooling
        if params.normalize is not None:
            spec = dataclasses.replace(spec, normalize=params.normalize)
        vector = finish_embedding(request.pooled, seq.num_tokens, spec, params.dimensions)
        return self._output(request, EmbeddingOutput(vector.tolist(), finish_reason="stop"))

    def _output(self, request: _Embedding, embedding: EmbeddingOutput) -> EmbeddingRequestOutput:
        seq, now = request.seq, time.time()
        start = seq.first_scheduled_time
        metrics = RequestMetrics(
            arrival_time=request.arrival_time,
            inference_start_time=start,
            time_in_queue=start - request.arrival_time if start is not None else None,
            model_forward_time=seq.forward_time,
            model_execute_time=now - request.arrival_time,
        )
        return EmbeddingRequestOutput(
            request_id=seq.request_id,
            prompt=request.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            outputs=embedding,
            finished=True,
            metrics=metrics,
            num_cached_tokens=seq.num_cached_tokens,
        )

    def _fail(self, faults: list[RequestFault]) -> list[EmbeddingRequestOutput]:
        """End each faulted request (KV blocks freed) with an error output naming the fault."""
        outputs = []
        for fault in faults:
            request = self.requests.pop(fault.request_id, None)
            if request is not None:
                self.scheduler.finish(request.seq)
                output = embedding_error_output(
                    fault.request_id, request.prompt, fault.message, request.arrival_time, INTERNAL_ERROR
                )
                output.prompt_token_ids = request.seq.prompt_token_ids
                outputs.append(output)
        return outputs
