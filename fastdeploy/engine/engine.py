"""The engine: requests in, steps of schedule -> execute -> update, `RequestOutput`s out.

A step (`step`) lets the features prepare (`StepFeature.before_schedule`), then the stepper
chosen at construction (`engine/stepper.py`: one pass at a time, overlapped, or pipelined)
schedules a batch (`schedule_batch`), runs it on the executor and hands the pass back:
`complete_batch` runs it with fault isolation, lets the features read the logits, samples the
rest, advances the batch and `emit` appends the tokens and builds the outputs. Construction
lives in `engine/builder.py`, outputs in `engine/output_processor.py`, each decoding feature in
its own module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastdeploy.config import EngineConfig
from fastdeploy.engine import builder
from fastdeploy.engine.admission import Admission
from fastdeploy.engine.async_scheduling import overlappable_batch
from fastdeploy.engine.bans import Bans
from fastdeploy.engine.fault_isolation import (
    OUTPUT_PROCESSING,
    PassResult,
    RequestFault,
    SampledPass,
    describe,
    without_requests,
)
from fastdeploy.engine.features import FeatureNeeds, build_features
from fastdeploy.engine.output_processor import OutputProcessor, error_output
from fastdeploy.engine.pass_logits import PassLogits
from fastdeploy.engine.pass_sampling import landed_tokens, pass_sampling
from fastdeploy.engine.request import OK, RequestOutput
from fastdeploy.engine.request_ends import RequestEnds
from fastdeploy.engine.sampler import BannedTokens, sample_tokens
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.sequence import EngineRequest, Sequence
from fastdeploy.engine.step_feature import HOOKS, hooks
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.executor.base import Executor, PassOutput
from fastdeploy.input.processor import InputProcessor
from fastdeploy.input.tokenizer import Tokenizer
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.lora import LoRARequest
from fastdeploy.plugins.registry import PluginRegistry
from fastdeploy.reasoning.base import ReasoningParser

__all__ = ["EngineRequest", "LLMEngine", "error_output"]

logger = get_logger(__name__)


def _registered(setting: str, name: str | None, registered: dict[str, type]) -> type | None:
    """The class registered under `name` (None when unset); an error listing the names otherwise."""
    if name is None:
        return None
    if name not in registered:
        known = ", ".join(sorted(registered)) or "none"
        raise InvalidArgumentError(f"{setting} {name!r} is not registered (registered: {known})")
    return registered[name]


class LLMEngine:
    """Owns the backend, model, tokenizer, KV cache and scheduler; `step()` advances all requests."""

    output_processor: OutputProcessor | None = None

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        setup = builder.prepare(config)
        self.backend, self.model_config = setup.backend, setup.model_config
        self.generation_defaults, self.max_logprobs = setup.generation_defaults, setup.max_logprobs
        self.max_model_len, self.max_num_batched_tokens = setup.max_model_len, setup.max_num_batched_tokens
        self.executor = setup.remote  # the rank processes, when the model runs in them
        try:
            self._load_inputs(config, setup.registry, setup.model_path)
            loaded = builder.load_model(config, setup, self.input_processor)
        except BaseException:
            self.shutdown()
            raise
        self.model = loaded.model
        self.kv_cache_spec, self.block_manager = loaded.kv_cache_spec, loaded.block_manager
        #: the resident LoRA adapters (`enable_lora`), None without
        self.loras = loaded.lora
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            self.max_num_batched_tokens,
            max_loras=config.max_loras if config.enable_lora else None,
        )
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(
            self.model_config.eos_token_ids
        )
        self.requests: dict[str, EngineRequest] = {}
        end = self.reasoning_parser.reasoning_end_token_ids() if self.reasoning_parser else None
        needs = FeatureNeeds(
            self.scheduler, self.tokenizer, self.eos_token_ids, end, self._spawn_beam, self._bans
        )
        features = build_features(config, setup, loaded, needs)
        self.fault_isolation, self.spec_decoder = features.fault_isolation, features.spec
        self.guided = features.guided
        #: prefill/decode disaggregation: `KVExport` on a prefill instance, `KVImport` on a decode one
        self.kv_transfer = features.kv_transfer
        self.bans = Bans(self.eos_token_ids, self.guided.grammar_complete, self.requests)
        limits = builder.engine_limits(config, setup)
        self.admission = Admission(
            config.seed,
            self.tokenizer,
            self.scheduler,
            self.requests,
            self.eos_token_ids,
            limits,
            features,
            self.loras,
        )
        self._hooks = {name: hooks(features.ordered, name) for name in HOOKS}
        self.output_processor = OutputProcessor(
            self.tokenizer,
            self.reasoning_parser,
            self.eos_token_ids,
            self.max_model_len,
            features.beams,
            features.spec,
            features.prompt_logprobs,
        )
        self.ends = RequestEnds(
            self.requests, self.scheduler, self.output_processor, self.fault_isolation, self._hooks["release"]
        )
        self.async_scheduling = builder.async_scheduling_on(config, self.backend)
        self.stepper = builder.choose_stepper(
            config, self, loaded.executor, self._overlaps, self.ends, self.scheduler.in_flight
        )
        logger.info(
            "engine ready: %s, max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d",
            self.model_config.architecture,
            self.max_model_len,
            config.max_num_seqs,
            self.max_num_batched_tokens,
        )

    @property
    def reasoning_parser(self) -> ReasoningParser | None:
        return self._reasoning_parser

    @reasoning_parser.setter
    def reasoning_parser(self, parser: ReasoningParser | None) -> None:
        """Set by `_load_inputs`, or replaced later (tests): the output processor follows."""
        self._reasoning_parser = parser
        if self.output_processor is not None:
            self.output_processor.reasoning_parser = parser

    @property
    def runner(self) -> Executor:
        """The executor the steps run on (tests and benchmarks swap it)."""
        return self.stepper.executor

    @runner.setter
    def runner(self, executor: Executor) -> None:
        self.stepper.executor = executor

    def _load_inputs(self, config: EngineConfig, registry: PluginRegistry, model_path: str) -> None:
        """The input processor (tokenizer, chat template, limits), the reasoning parser and the
        tool-call parser."""
        #: prompts, chat templates, media and their limits; what LLM, the server and the CLI use
        self.input_processor = InputProcessor.load(
            config, registry, model_path, self.model_config, self.max_model_len
        )
        self.tokenizer: Tokenizer = self.input_processor.tokenizer
        self.reasoning_parser = self._build_reasoning_parser(registry)
        self.tool_parser_class = self._tool_parser_class(registry)

    def check_health(self) -> None:
        """Raise WorkerFailedError if a rank process has died (cheap; the server calls it when idle)."""
        if self.executor is not None:
            self.executor.check_health()

    def shutdown(self) -> None:
        """Stop the rank processes, if the model runs in them (they also stop when this process exits)."""
        if self.executor is not None:
            self.executor.shutdown()

    def _build_reasoning_parser(self, registry: PluginRegistry) -> ReasoningParser | None:
        parser = _registered("reasoning_parser", self.config.reasoning_parser, registry.reasoning_parsers())
        return parser(self.tokenizer) if parser is not None else None

    def _tool_parser_class(self, registry: PluginRegistry) -> type | None:
        return _registered("tool_call_parser", self.config.tool_call_parser, registry.tool_call_parsers())

    # --- requests ---------------------------------------------------------------------------
    def validate_params(self, params: SamplingParams) -> None:
        """Raise InvalidArgumentError if this engine's limits rule out `params`."""
        self.admission.check(params)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        arrival_time: float | None = None,
        stream: bool = False,
        thinking_enabled: bool = True,
        multimodal: Any = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request; raises InvalidArgumentError (nothing queued) if it cannot be served.

        With `stream`, `step()` returns this request's progress after every step that adds tokens.
        `multimodal` is the processor's `MultiModalPrompt`; its (expanded) token ids are the prompt.
        `lora_request` names the LoRA adapter it runs with (`enable_lora`).
        """
        if request_id in self.requests:
            raise InvalidArgumentError(f"request_id {request_id!r} is already in use")
        prompt_token_ids = self.input_processor.engine_prompt(prompt_token_ids, multimodal)
        self.requests[request_id] = self.admission.admit(
            request_id,
            prompt_token_ids,
            params,
            prompt,
            arrival_time,
            stream,
            thinking_enabled,
            multimodal,
            lora_request,
        )

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now, free its KV blocks, and return its final output (None if unknown)."""
        return self.ends.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether `step()` has work: requests to run, or passes in flight still to collect."""
        return self.scheduler.has_unfinished() or self.stepper.busy

    # --- stepping: schedule -> execute -> update ----------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one forward pass; return the outputs of requests that finished during it.

        With async scheduling the pass is launched and the previous step's tokens are read, so
        outputs come one step after their pass (the first step of a run returns none; keep
        stepping while `has_unfinished_requests()`). A fault fails only the requests it touches
        (see `fault_isolation`): their outputs, with `error_code` 500, come back with the others.
        """
        for before_schedule in self._hooks["before_schedule"]:
            before_schedule(self.scheduler.running)
        return self.stepper.step()

    def schedule_batch(self) -> tuple[ScheduledBatch, list[RequestOutput]]:
        """The scheduler's next batch less the requests whose KV blocks could not be allocated,
        and those requests' failed outputs (every stepper schedules through here)."""
        batch = self.scheduler.schedule()
        failed = self.ends.fail(self.fault_isolation.allocation_faults(batch))
        batch = without_requests(batch, {output.request_id for output in failed})
        if getattr(self.runner, "samples_in_pass", False) and self.spec_decoder is None:
            batch.sampling = pass_sampling(batch, self.reasoning_parser is not None)
        return batch, failed

    def complete_batch(
        self,
        batch: ScheduledBatch,
        forward: Callable[[], PassOutput],
        forward_part: Callable[[ScheduledBatch], PassOutput] | None = None,
    ) -> list[RequestOutput]:
        """Run `forward` (batch's pass: logits, sampling indices, seconds), sample, advance the batch.

        `forward_part` runs any part of the batch; with it, a failed pass is run again one
        sequence at a time so that only the failing requests fail.
        """
        result: PassResult = self.fault_isolation.run_pass(
            batch,
            lambda: self._sampled(batch, forward()),
            None if forward_part is None else (lambda part: self._sampled(part, forward_part(part))),
        )
        outputs = self.ends.fail(result.faults)
        batch, register = result.batch, self.block_manager.register_full_blocks
        for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.forward_time += result.forward_seconds
            seq.num_computed_tokens += count
            register(seq)
        for after_pass in self._hooks["after_pass"]:
            after_pass(batch)
        return outputs + self.emit(result.sampled, result.tokens, result.refused)

    def _sampled(self, batch: ScheduledBatch, forward_result: PassOutput) -> SampledPass:
        """(sequences that emit tokens, the tokens each emits, seconds, requests refused) of a
        pass; raises on broken logits.

        Fault isolation runs a failed pass again per sequence, so what a pass changes before it
        can still fail must bear doing twice: prompt logprobs extend from the last position
        recorded, a beam's row replaces any earlier one, verification is committed later
        (`SpeculativeDecoder.commit`); the sampler, which records logprobs, runs last.
        """
        logits, sampling, forward_seconds = forward_result
        if batch.sampling is not None and batch.sampling.tokens is not None:  # sampled in the pass
            tokens = landed_tokens(self.backend, logits, batch.sampling)
            return [batch.seqs[index] for index in sampling], list(zip(tokens)), forward_seconds, {}
        rows = PassLogits(logits, self.backend, batch, sampling)
        if not sampling and not rows.extras:
            return [], [], forward_seconds, {}
        claimed: list[Sequence] = []
        runs: list[tuple[int, ...]] = []
        for read_logits in self._hooks["read_logits"]:
            emitted = read_logits(rows, batch)
            if emitted:
                claimed += emitted[0]
                runs += emitted[1]
        sampled, tokens, conflicts = self._sample_pass(rows, batch)
        refused = {sampled[row].request_id: why for row, why in conflicts.items()}
        if claimed:  # one token per sampled sequence, a run per claimed one
            return sampled + claimed, [*zip(tokens), *runs], forward_seconds, refused
        return sampled, list(zip(tokens)), forward_seconds, refused

    def _sample_pass(
        self, logits: PassLogits, batch: ScheduledBatch
    ) -> tuple[list[Sequence], list[int], dict[int, str]]:
        """The sequences that sample one token from this pass (rows no feature claimed), their
        tokens, and the rows (into those sequences) that must be refused (their bans conflict
        with their grammar)."""
        indices = logits.plain
        if not indices:
            return [], [], {}
        sampled = [batch.seqs[index] for index in indices]
        if len(indices) == len(logits.sampling):  # the usual pass: every sampling row, in order
            rows = logits.device_rows(list(range(len(indices))))
        else:
            rows = logits.device_rows([logits.sampling_row(index) for index in indices])
        for mask in self._hooks["mask"]:
            rows = mask(self.backend, rows, sampled)
        bans = self._bans(batch.seqs, indices)
        # rows whose bans leave nothing their grammar allows: sampled without the bans, then refused
        conflicts: dict[int, str] = {}
        for refusals in self._hooks["refusals"]:
            conflicts.update(refusals(bans))
        bans = [ban for ban in bans if ban.row not in conflicts]
        return sampled, self._sample(rows, sampled, bans), conflicts

    def _spawn_beam(self, parent: Sequence) -> Sequence:
        return self.admission.spawn_beam(parent)

    def _overlaps(self, batch: ScheduledBatch) -> bool:
        return overlappable_batch(batch, self.reasoning_parser is not None)

    def _bans(self, seqs: list[Sequence], sampling: list[int]) -> list[BannedTokens]:
        return self.bans(seqs, sampling)

    def _sample(self, logits: Any, seqs: list[Sequence], bans: list[BannedTokens]) -> list[int]:
        return sample_tokens(self.backend, logits, seqs, bans)

    def emit(
        self, sampled: list[Sequence], emitted: list[tuple[int, ...]], refused: dict[str, str] | None = None
    ) -> list[RequestOutput]:
        """Append each sampled sequence's new tokens (text, stop checks, finishing), let the
        features follow (`after_emit`); the outputs of the requests that finished or stream.
        `refused` requests (request id -> why) fail instead."""
        refused = refused or {}
        now = time.time()
        touched: dict[str, EngineRequest] = {}
        finishing: set[str] = set()
        broken: list[RequestFault] = []
        requests, append_tokens = self.requests, self.output_processor.append_tokens
        for seq, new_tokens in zip(sampled, emitted, strict=True):
            if seq.request_id in refused:
                continue
            if seq.first_token_time is None:
                seq.first_token_time = now
            request = requests[seq.request_id]
            try:
                append_tokens(seq, new_tokens, request.thinking_enabled)
            except Exception as exc:  # e.g. a tokenizer plugin that cannot decode: this request alone fails
                message = f"processing a sampled token failed: {describe(exc)}"
                broken.append(self.fault_isolation.record(seq.request_id, OUTPUT_PROCESSING, message))
                continue
            if seq.finish_reason is not None:
                seq.finish_time = now
                self.scheduler.finish(seq)
                finishing.add(seq.request_id)
            touched[seq.request_id] = request
        outputs = self.ends.refuse(refused) + self.ends.fail(broken)
        for after_emit in self._hooks["after_emit"]:
            for request_id in after_emit(sampled, self.requests):
                touched[request_id] = self.requests[request_id]
                finishing.add(request_id)
        for request in touched.values():
            if request.request_id not in self.requests:  # failed above (another of its samples)
                continue
            finished = request.request_id in finishing and request.finished
            if not (finished or request.stream):
                continue
            output = self.ends.output_or_fault(request)
            if finished or output.error_code != OK:
                self.ends.drop(request)
            outputs.append(output)
        return outputs
