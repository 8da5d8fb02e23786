"""The engine: requests in, steps of scheduling / forward / sampling, `RequestOutput`s out."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend, BackendOptions, KVCacheSpec
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.backends.selection import build_backend_of, select_backend_class
from fastdeploy.config import EngineConfig
from fastdeploy.distributed.pipeline import MicroBatchPipeline
from fastdeploy.distributed.startup import start_executor
from fastdeploy.engine.async_scheduling import (
    InFlightPass,
    drop_placeholders,
    expect_next_tokens,
    greedy_without_extras,
    overlappable,
    placeholder_feed,
)
from fastdeploy.engine.beam_search import BeamSearch, record_beam_rows
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.fault_isolation import (
    GUIDED_DECODING_CONFLICT,
    OUTPUT_PROCESSING,
    FaultIsolation,
    PassResult,
    ProbePass,
    RequestFault,
    SampledPass,
    check_logits,
    describe,
    without_requests,
)
from fastdeploy.engine.generation_defaults import read_generation_defaults
from fastdeploy.engine.guided.decoder import GuidedDecoder
from fastdeploy.engine.kv_cache_planner import plan_kv_cache
from fastdeploy.engine.output_processor import banned_bad_word_tokens, completion_output, process_token
from fastdeploy.engine.pass_logits import PassLogits
from fastdeploy.engine.prompt_logprobs import record_prompt_logprobs
from fastdeploy.engine.request import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    OK,
    CompletionOutput,
    RequestMetrics,
    RequestOutput,
)
from fastdeploy.engine.sampler import BannedTokens, sample
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import ScheduledBatch, Scheduler
from fastdeploy.engine.sequence import Sequence, SequenceStatus
from fastdeploy.engine.spec_decode.decoder import Verified, build_speculative_decoder
from fastdeploy.errors import EngineDeadError, InvalidArgumentError, KVCacheAllocationError
from fastdeploy.input.detokenizer import IncrementalDetokenizer
from fastdeploy.input.multimodal.options import build_multimodal_processor, check_limits, media_policy
from fastdeploy.input.tokenizer import Tokenizer
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.model_loader import (
    CheckpointInfo,
    build_model,
    check_backend_kv_cache_dtype,
    check_backend_quantization,
    inspect_checkpoint,
)
from fastdeploy.model_executor.model_runner import ModelRunner
from fastdeploy.model_resolver import resolve_model
from fastdeploy.plugins.registry import PluginRegistry, first_that_can_load, get_registry
from fastdeploy.reasoning.base import ReasoningParser

logger = get_logger(__name__)


@dataclass
class EngineRequest:
    """A request inside the engine: its prompt, its samples and their shared settings."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    seqs: list[Sequence] = field(default_factory=list)
    bad_words_ids: list[list[int]] = field(default_factory=list)
    #: emit an output after every step that adds tokens, not only when finished
    stream: bool = False
    #: False when the request turned thinking off (chat_template_kwargs enable_thinking=False)
    thinking_enabled: bool = True
    #: images and videos of the prompt (`MultiModalPrompt`), None for text-only requests
    multimodal: Any = None
    #: the search state of a beam-search request
    beam_search: BeamSearch | None = None
    #: generated-token limit of each sample (max_tokens within max_model_len)
    max_output_tokens: int = 0

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)


def error_output(
    request_id: str, prompt: str | None, message: str, arrival_time: float, code: int
) -> RequestOutput:
    """The output of a request that failed before or during generation."""
    now = time.time()
    return RequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=[],
        outputs=CompletionOutput(index=0, send_idx=0, token_ids=[], text="", finish_reason="abort"),
        finished=True,
        metrics=RequestMetrics(arrival_time=arrival_time, model_execute_time=now - arrival_time),
        error_code=code,
        error_msg=message,
    )


def _device_samplable(params: SamplingParams) -> bool:
    """Whether the backends' sampling kernel (temperature, top-k, top-p) covers these settings."""
    return (
        not params.greedy
        and params.repetition_penalty == 1.0
        and not params.frequency_penalty
        and not params.presence_penalty
        and params.min_p == 0.0
        and params.logprobs is None
        and params.num_samples == params.n  # best_of ranks samples by their logprobs
    )


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

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        registry = get_registry()
        backend_class = select_backend_class(config.device, registry)
        if config.runs_in_rank_processes:
            # the ranks send the logits to the host: the engine samples them with the cpu ops
            self.backend = CpuBackend(BackendOptions(threads=1))
        else:
            self.backend = build_backend_of(
                backend_class, BackendOptions(threads=config.cpu_threads, dtype=config.dtype)
            )
            check_backend_quantization(config.quantization, self.backend)
            check_backend_kv_cache_dtype(config, self.backend)
        model_path = resolve_model(config.model)
        checkpoint = inspect_checkpoint(model_path, registry)
        self.model_config = checkpoint.config
        #: SamplingParams fields the checkpoint's generation_config.json sets, for unset ones
        self.generation_defaults = read_generation_defaults(model_path, config.generation_config)
        self.max_model_len = self._resolve_max_model_len()
        self.max_num_batched_tokens = config.max_num_batched_tokens or max(
            self.max_model_len, backend_class.default_max_num_batched_tokens
        )
        vocab = self.model_config.vocab_size
        self.max_logprobs = vocab if config.max_logprobs == -1 else min(config.max_logprobs, vocab)
        # rank processes start loading now, while this process reads the tokenizer
        self.executor = (
            start_executor(config, checkpoint, self.max_model_len, self.max_num_batched_tokens, registry)
            if config.runs_in_rank_processes
            else None
        )
        try:
            self._load_inputs(config, registry, model_path)
            self._load_model(config, checkpoint, registry)
        except BaseException:
            self.shutdown()
            raise
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, self.max_num_batched_tokens)
        self.spec_decoder = None
        if config.speculative_config is not None:
            manager = self.block_manager
            self.spec_decoder = build_speculative_decoder(
                config.speculative_config,
                self.backend,
                registry,
                self.max_model_len,
                (manager.block_size, manager.num_blocks),
                self.model_config.vocab_size,
            )
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(
            self.model_config.eos_token_ids
        )
        self.guided = GuidedDecoder(
            config.guided_decoding_backend,
            self.tokenizer,
            self.model_config.vocab_size,
            sorted(self.eos_token_ids),
            self.reasoning_parser.reasoning_end_token_ids() if self.reasoning_parser else None,
            config.guided_decoding_disable_any_whitespace,
        )
        #: steps overlap (`engine/async_scheduling.py`) where passes run beside the host
        self.async_scheduling = (
            config.async_scheduling
            if config.async_scheduling is not None
            else type(self.backend).overlaps_host and config.async_scheduling_blocker() is None
        )
        #: the pass launched by the last step whose tokens the host has not read yet
        self._in_flight: InFlightPass | None = None
        self.requests: dict[str, EngineRequest] = {}
        self._next_seq_id = 0
        self._request_counter = 0
        logger.info(
            "engine ready: %s, max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d",
            self.model_config.architecture,
            self.max_model_len,
            config.max_num_seqs,
            self.max_num_batched_tokens,
        )

    def _load_inputs(self, config: EngineConfig, registry: PluginRegistry, model_path: str) -> None:
        """The tokenizer, its chat template and the reasoning parser."""
        tokenizer_path = resolve_model(config.tokenizer) if config.tokenizer else model_path
        self.tokenizer: Tokenizer = first_that_can_load(
            registry.tokenizer_loaders(), tokenizer_path, "tokenizer loader"
        ).load(tokenizer_path)
        if config.chat_template is not None:
            from fastdeploy.input.chat_template import load_chat_template

            self.tokenizer.chat_template = load_chat_template(config.chat_template)
        elif not self.tokenizer.chat_template:
            # a plugin may ship the template for an architecture whose checkpoints lack one
            self.tokenizer.chat_template = registry.chat_templates().get(self.model_config.architecture)
        self.reasoning_parser = self._build_reasoning_parser(registry)
        self.tool_parser_class = self._tool_parser_class(registry)

    def _load_model(self, config: EngineConfig, checkpoint: CheckpointInfo, registry: PluginRegistry) -> None:
        """The model and its KV cache: here, or in the rank processes (which size their own caches)."""
        #: keeps several steps in flight when the layers are split into pipeline stages
        self.pipeline: MicroBatchPipeline | None = None
        #: turns images and videos into model inputs; None for text-only models
        self.mm_processor = None
        #: most images / videos per request (`limit_mm_per_prompt`), enforced before the processor
        self.mm_limits = check_limits(config.limit_mm_per_prompt)
        #: where requests' media may come from (local files, fetched URLs)
        self.media_policy = media_policy(config)
        if self.executor is not None:
            self.model = None
            num_blocks = self.executor.wait_ready()
            self.runner = self.executor
            self.fault_isolation = FaultIsolation(probe=None)  # a dead rank raises WorkerFailedError
            if config.pipeline_parallel_size > 1:
                self.pipeline = MicroBatchPipeline(self.executor, config.pipeline_parallel_size)
            self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
            return
        self.model = build_model(
            checkpoint, self.backend, self.max_model_len, registry, quantization=config.quantization
        )
        self.mm_processor = build_multimodal_processor(
            registry, self.model, self.tokenizer, self.model_config, config, self.mm_limits, self.media_policy
        )
        spec = plan_kv_cache(
            config,
            self.model_config,
            self.backend,
            self.max_model_len,
            self.model,
            self.max_num_batched_tokens,
        )
        self.kv_cache_spec = spec
        self.block_manager = BlockManager(spec.num_blocks, spec.block_size, config.enable_prefix_caching)
        kv_caches = self._allocate_kv_cache(spec)
        graphs = None
        if not config.enforce_eager and getattr(self.model, "supports_decode_graphs", True):
            graphs = self.backend.decode_graphs(
                self.model, kv_caches, spec.block_size, config.max_num_seqs, self.max_model_len
            )
        self.runner = ModelRunner(self.model, self.backend, kv_caches, spec.block_size, graphs)
        self.fault_isolation = FaultIsolation(ProbePass(self.backend, spec, self._probe_forward))

    def _allocate_kv_cache(self, spec: KVCacheSpec) -> list[Any]:
        try:
            return self.backend.allocate_kv_cache(spec)
        except Exception as exc:
            size = spec.num_blocks * spec.bytes_per_block()
            raise KVCacheAllocationError(
                f"the {self.backend.name} backend could not allocate the KV cache ({spec.num_blocks} blocks, "
                f"{size / 2**20:.0f} MiB): {describe(exc)}; lower kv_cache_memory, gpu_memory_utilization "
                "or num_gpu_blocks_override"
            ) from exc

    def _probe_forward(self, kv_caches: list[Any], batch: ScheduledBatch) -> Any:
        """Logits of `batch` run on `kv_caches` (the fault isolation's device probe; no graphs)."""
        runner = ModelRunner(self.model, self.backend, kv_caches, self.block_manager.block_size)
        return runner.execute(batch)[0]

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

    def _resolve_max_model_len(self) -> int:
        model_limit = self.model_config.max_position_embeddings
        if self.config.max_model_len is None:
            return model_limit
        if self.config.max_model_len > model_limit:
            logger.warning(
                "max_model_len %d exceeds the model's max_position_embeddings %d",
                self.config.max_model_len,
                model_limit,
            )
            # the rotary tables (cos and sin, float32) are built for every position up front
            table_bytes = self.config.max_model_len * self.model_config.head_dim * 8
            free = self.backend.free_memory_bytes()
            if table_bytes > free:
                raise InvalidArgumentError(
                    f"max_model_len={self.config.max_model_len} would need {table_bytes / 2**30:.1f} GiB of "
                    f"rotary tables alone, more than the {free / 2**30:.1f} GiB free; the model was trained "
                    f"for {model_limit} positions"
                )
        return self.config.max_model_len

    # --- requests ---------------------------------------------------------------------------
    def validate_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raise InvalidArgumentError if the engine cannot serve these prompt tokens."""
        if not prompt_token_ids:
            raise InvalidArgumentError("prompt is empty: it must contain at least one token")
        vocab = self.model_config.vocab_size
        bad = [token for token in prompt_token_ids if not 0 <= token < vocab]
        if bad:
            raise InvalidArgumentError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}")
        if len(prompt_token_ids) >= self.max_model_len:
            raise InvalidArgumentError(
                f"prompt has {len(prompt_token_ids)} tokens, which leaves no room to generate within "
                f"max_model_len={self.max_model_len}; shorten the prompt or raise max_model_len"
            )

    def validate_params(self, params: SamplingParams) -> None:
        """Raise InvalidArgumentError if this engine's limits rule out `params`."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                raise InvalidArgumentError(
                    f"SamplingParams.{name} must be in [0, {self.max_logprobs}] (the engine's "
                    f"max_logprobs), got {value}"
                )
        if params.prompt_logprobs is not None and self.pipeline is not None:
            raise InvalidArgumentError(
                "SamplingParams.prompt_logprobs is not supported with pipeline_parallel_size > 1"
            )
        width_name = "best_of" if params.best_of is not None else "n"
        if params.num_samples > self.config.max_num_seqs:
            raise InvalidArgumentError(
                f"SamplingParams.{width_name}={params.num_samples} exceeds the engine's max_num_seqs "
                f"({self.config.max_num_seqs}): every sample (or beam) is a running sequence"
            )
        if params.use_beam_search and not self._copies_kv_blocks():
            raise InvalidArgumentError(
                f"SamplingParams.use_beam_search is not supported on the {self.config.device} backend: it "
                "cannot copy KV blocks (Backend.copy_kv_blocks), which beams need to share them"
            )

    def _copies_kv_blocks(self) -> bool:
        """Whether the backend (here or in the rank processes) implements `copy_kv_blocks`."""
        backend_class = self.executor.backend_class if self.executor is not None else type(self.backend)
        return backend_class.copy_kv_blocks is not Backend.copy_kv_blocks

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
    ) -> None:
        """Queue a request; raises InvalidArgumentError (nothing queued) if it cannot be served.

        With `stream`, `step()` returns this request's progress after every step that adds tokens.
        `multimodal` is the processor's `MultiModalPrompt`; its (expanded) token ids are the prompt.
        """
        if request_id in self.requests:
            raise InvalidArgumentError(f"request_id {request_id!r} is already in use")
        if multimodal is not None:
            if self.mm_processor is None:
                raise InvalidArgumentError(self.media_refusal())
            prompt_token_ids = multimodal.token_ids
        self.validate_prompt(prompt_token_ids)
        self.validate_params(params)
        grammar = self.guided.compile(params.guided_decoding) if params.guided_decoding else None
        arrival = time.time() if arrival_time is None else arrival_time
        room = self.max_model_len - len(prompt_token_ids)
        request = EngineRequest(
            request_id,
            prompt,
            list(prompt_token_ids),
            params,
            arrival,
            # best_of and beam requests choose their outputs at the end: nothing to stream before
            stream=stream and params.num_samples == params.n and not params.use_beam_search,
            thinking_enabled=thinking_enabled,
            multimodal=multimodal,
            max_output_tokens=min(params.max_tokens, room) if params.max_tokens is not None else room,
        )
        request.bad_words_ids = self._bad_words_ids(params.bad_words)
        self._request_counter += 1
        for index in range(1 if params.use_beam_search else params.num_samples):
            seq = self._new_sequence(request, index)
            if index == 0 and params.prompt_logprobs is not None:
                seq.prompt_logprobs = [None]
            if grammar is not None:
                self.guided.add(seq, grammar, thinking_enabled)
            self.scheduler.add(seq)
        if params.use_beam_search:
            request.beam_search = BeamSearch(
                request.seqs[0], params.num_samples, self._stop_token_ids(params), request.max_output_tokens
            )
            request.seqs[0].beam_search = request.beam_search
        self.requests[request_id] = request

    def media_refusal(self) -> str:
        """Why this engine refuses images and videos: the processor lives with an in-process model."""
        architecture = self.model_config.architecture
        if self.executor is not None:
            return (
                f"{architecture} runs in rank processes here (distributed_executor_backend='mp'); "
                "images and videos need the model in the engine process"
            )
        return f"{architecture} takes text only, not images or videos"

    def _new_sequence(self, request: EngineRequest, index: int) -> Sequence:
        """Sample `index` of `request`, seeded from the request's seed (or the engine's) and `index`."""
        params = request.params
        seed = (
            (params.seed, index)
            if params.seed is not None
            else (self.config.seed, self._request_counter, index)
        )
        seq = Sequence(
            seq_id=self._next_seq_id,
            request_id=request.request_id,
            sample_index=index,
            prompt_token_ids=request.prompt_token_ids,
            params=params,
            max_output_tokens=request.max_output_tokens,
            rng=np.random.default_rng(list(seed)),
            arrival_time=request.arrival_time,
            detokenizer=IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
            # beams take no text (their outputs decode the hypotheses), and a sequence reused for
            # another beam gets that beam's tokens: only plain samples detokenize, late when unread
            defer_text=not request.stream and not params.stop and not params.use_beam_search,
            extra_inputs=request.multimodal,
        )
        ranked = params.num_samples > params.n and not params.use_beam_search
        if ranked or params.logprobs is not None:
            seq.cumulative_logprob = 0.0  # best_of ranks the samples by it
        self._next_seq_id += 1
        request.seqs.append(seq)
        return seq

    def _stop_token_ids(self, params: SamplingParams) -> frozenset[int]:
        """Tokens inside the vocabulary that end a sample: EOS (unless ignore_eos) and stop_token_ids."""
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        return frozenset(token for token in stops if token < self.model_config.vocab_size)

    def _spawn_beam(self, parent: Sequence) -> Sequence:
        """A new sequence for a beam forked from `parent`, queued where the parent is."""
        request = self.requests[parent.request_id]
        child = self._new_sequence(request, len(request.seqs))
        child.beam_search = parent.beam_search
        child.first_scheduled_time = parent.first_scheduled_time
        self.scheduler.add_fork(child, parent)
        return child

    def _bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """Token sequences of each bad word, alone and after a space (how it appears mid-text)."""
        sequences: list[list[int]] = []
        for word in words:
            for variant in (word, " " + word.lstrip()):
                ids = self.tokenizer.encode(variant, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        return sequences

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now, free its KV blocks, and return its final output (None if unknown)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        self._finish_all(request)
        return self._output_or_fault(request)

    def _finish_all(self, request: EngineRequest) -> None:
        """Stop every unfinished sample of `request` ("abort"), free its KV blocks and encoder outputs."""
        if request.multimodal is not None:
            request.multimodal.release_encoder_outputs()
        for seq in request.seqs:
            self.guided.discard(seq)
            if not seq.is_finished:
                seq.finish_reason = "abort"
                seq.finish_time = time.time()
                self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        """Whether `step()` has work: requests to run, or pipeline steps still to collect."""
        return (
            self.scheduler.has_unfinished()
            or self._in_flight is not None
            or (self.pipeline is not None and self.pipeline.busy)
        )

    # --- stepping ---------------------------------------------------------------------------
    def _bans(self, seqs: list[Sequence], sampling: list[int]) -> list[BannedTokens]:
        bans = []
        for row, index in enumerate(sampling):
            reasons = self._ban_reasons(seqs[index])
            if reasons:
                bans.append(BannedTokens(row, [token for ids in reasons.values() for token in ids], reasons))
        return bans

    def _ban_reasons(self, seq: Sequence) -> dict[str, list[int]]:
        """The tokens `seq` may not take next, under the setting (as users write it) that bans them."""
        params = seq.params
        reasons: dict[str, list[int]] = {}
        if params.min_tokens and seq.num_output_tokens < params.min_tokens:
            if not params.ignore_eos and not self.guided.grammar_complete(seq):
                reasons[f"min_tokens={params.min_tokens} (no EOS before that)"] = sorted(self.eos_token_ids)
            if params.stop_token_ids:
                before = f"before min_tokens={params.min_tokens}"
                reasons[f"stop_token_ids {params.stop_token_ids} ({before})"] = params.stop_token_ids
        bad_words_ids = self.requests[seq.request_id].bad_words_ids
        if bad_words_ids:
            words = banned_bad_word_tokens(seq, bad_words_ids)
            if words:
                reasons[f"bad_words {params.bad_words}"] = words
        return reasons

    def _sample(self, logits: Any, seqs: list[Sequence], bans: list[BannedTokens]) -> list[int]:
        """One token per sampling sequence: on the device when the backend samples there and every
        row needs only temperature / top-k / top-p, else on the host with the full sampler.

        Either way each sequence draws its uniform from its own generator, one per token.
        """
        backend = self.backend
        distinct_params = {id(seq.params): seq.params for seq in seqs}.values()  # often one per batch
        if not bans and all(greedy_without_extras(params) for params in distinct_params):
            return np.asarray(backend.argmax_rows(logits)).tolist()
        if backend.samples_on_device and not bans and all(_device_samplable(p) for p in distinct_params):
            params = [seq.params for seq in seqs]
            tokens = backend.sample_top_k_top_p(
                logits,
                np.array([p.temperature for p in params], dtype=np.float32),
                np.array([max(p.top_k, 0) for p in params], dtype=np.int32),
                np.array([p.top_p for p in params], dtype=np.float32),
                np.array([seq.rng.random() for seq in seqs], dtype=np.float32),
            )
            return [int(token) for token in np.asarray(tokens)]
        return sample(backend.to_numpy(logits), seqs, bans)

    def step(self) -> list[RequestOutput]:
        """Run one forward pass; return the outputs of requests that finished during it.

        With async scheduling the pass is launched and the previous step's tokens are read, so
        outputs come one step after their pass (the first step of a run returns none; keep
        stepping while `has_unfinished_requests()`). A fault fails only the requests it touches
        (see `fault_isolation`): their outputs, with `error_code` 500, come back with the others.
        """
        self.fault_isolation.begin_step()
        if self.spec_decoder is not None:
            self.spec_decoder.propose(self.scheduler.running)
        if self.pipeline is not None:
            return self.pipeline.step(self)
        if not self.async_scheduling:
            batch, failed = self.schedule_batch()
            if not batch.seqs:
                return failed
            return failed + self.complete_batch(
                batch, lambda: self.runner.execute(batch), self.runner.execute
            )
        return self._async_step()

    def _async_step(self) -> list[RequestOutput]:
        """Launch this step's pass, then read the last step's tokens (`async_scheduling.py`);
        a batch that cannot overlap waits for the pass in flight and runs as `step()` runs it."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            expect_next_tokens(flight, self.max_model_len)
        batch, outputs = self.schedule_batch()
        if batch.seqs and self._overlappable(batch):
            try:
                launched = self._launch(batch, flight)
            except EngineDeadError:
                raise
            except Exception as exc:  # run again below, where fault isolation finds the culprits
                logger.warning("an overlapped pass failed to launch (%s); running it in step", describe(exc))
            else:
                self._in_flight = launched
                return outputs + (self._land(flight) if flight is not None else [])
        if flight is not None:
            outputs += self._land(flight)
            batch = batch.part(i for i, seq in enumerate(batch.seqs) if not seq.is_finished)
        if not batch.seqs:
            return outputs
        return outputs + self.complete_batch(batch, lambda: self.runner.execute(batch), self.runner.execute)

    def _overlappable(self, batch: ScheduledBatch) -> bool:
        distinct_params = {id(seq.params): seq.params for seq in batch.seqs}.values()
        budget_applies = self.reasoning_parser is not None
        return all(overlappable(params, budget_applies) for params in distinct_params) and all(
            seq.extra_inputs is None for seq in batch.seqs
        )

    def _launch(self, batch: ScheduledBatch, flight: InFlightPass | None) -> InFlightPass:
        """Queue `batch`'s pass and its greedy tokens on the device; its sequences count the
        tokens as computed (the next step schedules them on), the host reads them next step."""
        feed = placeholder_feed(self.backend, batch, flight)
        logits, sampling, seconds = self.runner.execute(batch, feed)
        tokens = self.backend.greedy_tokens(logits) if sampling else None
        for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += count
        return InFlightPass(batch, [batch.seqs[index] for index in sampling], tokens, seconds)

    def _land(self, flight: InFlightPass) -> list[RequestOutput]:
        """Read `flight`'s tokens into its sequences, as `complete_batch` does after a pass; rows
        with broken logits fail their requests, rows of sequences that ended meanwhile are dropped."""
        drop_placeholders(flight.sampled)
        tokens, broken = flight.tokens.wait() if flight.tokens is not None else ([], [])
        faults = {
            seq.request_id
            for seq, bad in zip(flight.sampled, broken, strict=True)
            if bad and seq.request_id in self.requests
        }
        outputs = self._fail([self.fault_isolation.nonfinite(request_id) for request_id in faults])
        if faults and len(faults) == len({seq.request_id for seq in flight.sampled}):
            self.fault_isolation.check_device()  # every request of the pass failed: is the device lost?
        for seq in flight.batch.seqs:
            if seq.status is SequenceStatus.RUNNING:
                seq.forward_time += flight.forward_seconds
                self.block_manager.register_full_blocks(seq)
        live = [
            (seq, (int(token),))
            for seq, token in zip(flight.sampled, tokens, strict=True)
            if not seq.is_finished and seq.request_id in self.requests
        ]
        return outputs + self._emit([seq for seq, _ in live], [token for _, token in live])

    def schedule_batch(self) -> tuple[ScheduledBatch, list[RequestOutput]]:
        """The scheduler's next batch less the requests whose KV blocks could not be allocated,
        and those requests' failed outputs (every forward path schedules through here)."""
        batch = self.scheduler.schedule()
        failed = self._fail(self.fault_isolation.allocation_faults(batch))
        return without_requests(batch, {output.request_id for output in failed}), failed

    def complete_batch(
        self,
        batch: ScheduledBatch,
        forward: Callable[[], tuple[Any, list[int], float]],
        forward_part: Callable[[ScheduledBatch], tuple[Any, list[int], float]] | None = None,
    ) -> list[RequestOutput]:
        """Run `forward` (batch's pass: logits, sampling indices, seconds), sample, advance the batch.

        `forward_part` runs any part of the batch; with it, a failed pass is run again one
        sequence at a time so that only the failing requests fail.
        """
        result = self._isolated_pass(batch, forward, forward_part)
        outputs = self._fail(result.faults)
        batch = result.batch
        beams: list[Sequence] = []
        verified: list[Sequence] = []
        for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.forward_time += result.forward_seconds
            if seq.draft_token_ids:  # only its last token and the accepted drafts stand
                count -= self.spec_decoder.num_rejected(seq)
                verified.append(seq)
            seq.num_computed_tokens += count
            self.block_manager.register_full_blocks(seq)
            if seq.draft_token_ids:  # give back the blocks that held only rejected drafts
                self.block_manager.truncate(seq)
                seq.draft_token_ids = []
            elif seq.beam_search is not None:
                beams.append(seq)
        return outputs + self._emit(result.sampled, result.tokens, result.refused, verified, beams)

    def _emit(
        self,
        sampled: list[Sequence],
        emitted: list[tuple[int, ...]],
        refused: dict[str, str] | None = None,
        verified: list[Sequence] | None = None,
        beams: list[Sequence] | None = None,
    ) -> list[RequestOutput]:
        """Append each sampled sequence's new tokens (text, stop checks, finishing), advance
        verified drafts, guided states and beam searches; the outputs of the requests that
        finished or stream. `refused` requests (request id -> why) fail instead."""
        refused = refused or {}
        now = time.time()
        touched: dict[str, EngineRequest] = {}
        finishing: set[str] = set()
        broken: list[RequestFault] = []
        outputs: list[RequestOutput] = []
        for seq, new_tokens in zip(sampled, emitted, strict=True):
            if seq.request_id in refused:
                continue
            if seq.first_token_time is None:
                seq.first_token_time = now
            try:
                for token in new_tokens:
                    process_token(
                        seq, self._forced_reasoning_end(seq, token), self.eos_token_ids, self.max_model_len
                    )
                    if seq.finish_reason is not None:
                        break
            except Exception as exc:  # e.g. a tokenizer plugin that cannot decode: this request alone fails
                message = f"processing a sampled token failed: {describe(exc)}"
                broken.append(self.fault_isolation.record(seq.request_id, OUTPUT_PROCESSING, message))
                continue
            if seq.finish_reason is not None:
                seq.finish_time = now
                self.scheduler.finish(seq)
                finishing.add(seq.request_id)
            touched[seq.request_id] = self.requests[seq.request_id]
        outputs += self._refuse(refused) + self._fail(broken)
        for seq in verified or []:  # logprobs of the tokens each verified run took, statistics
            if seq.request_id in self.requests:
                self.spec_decoder.commit(seq)
        self.guided.advance(sampled)
        self._advance_beams(beams or [], touched, finishing)
        for request in touched.values():
            if request.request_id not in self.requests:  # failed above (another of its samples)
                continue
            finished = request.request_id in finishing and request.finished
            if not (finished or request.stream):
                continue
            output = self._output_or_fault(request)
            if finished or output.error_code != OK:
                del self.requests[request.request_id]
                if request.multimodal is not None:
                    request.multimodal.release_encoder_outputs()
            outputs.append(output)
        return outputs

    # --- fault isolation (fastdeploy/engine/fault_isolation.py) -------------------------------
    def _isolated_pass(
        self,
        batch: ScheduledBatch,
        forward: Callable[[], tuple[Any, list[int], float]],
        forward_part: Callable[[ScheduledBatch], tuple[Any, list[int], float]] | None,
    ) -> PassResult:
        return self.fault_isolation.run_pass(
            batch,
            lambda: self._sampled(batch, forward()),
            None if forward_part is None else (lambda part: self._sampled(part, forward_part(part))),
        )

    def _sample_pass(
        self, logits: PassLogits, batch: ScheduledBatch
    ) -> tuple[list[Sequence], list[int], dict[int, str]]:
        """The sequences that sample one token from this pass (beams and drafts aside), their
        tokens, and the rows (into those sequences) whose bans conflict with their grammar."""
        indices = logits.plain
        if not indices:
            return [], [], {}
        sampled = [batch.seqs[index] for index in indices]
        if len(indices) == len(logits.sampling):  # the usual pass: every sampling row, in order
            rows = logits.device_rows(list(range(len(indices))))
        else:
            rows = logits.device_rows([logits.sampling_row(index) for index in indices])
        rows = self.guided.apply(self.backend, rows, sampled)
        bans = self._bans(batch.seqs, indices)
        # rows whose bans leave nothing their grammar allows: sampled without the bans, then failed
        conflicts = self.guided.conflicts(bans)
        bans = [ban for ban in bans if ban.row not in conflicts]
        return sampled, self._sample(rows, sampled, bans), conflicts

    def _advance_beams(
        self, beams: list[Sequence], touched: dict[str, EngineRequest], finishing: set[str]
    ) -> None:
        """Run a search step for each beam request whose beams all have their rows (beams get rows
        only from the passes they sample in); a finished search's request goes into `touched` and
        `finishing`."""
        for seq in beams:
            search = seq.beam_search
            if not search.ready:
                continue
            running = search.step()
            released = search.apply(running, self.block_manager, self._spawn_beam)
            finished = released + (search.beams if search.done else [])
            now = time.time()
            for beam in search.beams:
                if beam.first_token_time is None:
                    beam.first_token_time = now
            for beam in finished:
                beam.finish_reason = "length"  # bookkeeping only: outputs come from the hypotheses
                beam.finish_time = now
                self.scheduler.finish(beam)
            if search.done:
                touched[seq.request_id] = self.requests[seq.request_id]
                finishing.add(seq.request_id)

    def _sampled(self, batch: ScheduledBatch, forward_result: tuple[Any, list[int], float]) -> SampledPass:
        """(sequences that emit tokens, the tokens each emits, seconds, requests refused) of a
        pass; raises on broken logits.

        Fault isolation runs a failed pass again per sequence, so what a pass changes before it
        can still fail must bear doing twice: prompt logprobs extend from the last position
        recorded, a beam's row replaces any earlier one, verification is committed later
        (`SpeculativeDecoder.commit`); the sampler, which records logprobs, runs last.
        """
        logits, sampling, forward_seconds = forward_result
        rows = PassLogits(logits, self.backend, batch, sampling)
        if not sampling and not rows.extras:
            return [], [], forward_seconds, {}
        # the model's own logits (every row: sampled, scored and verified), before any mask
        check_logits(self.backend, logits)
        record_prompt_logprobs(rows, batch)
        record_beam_rows(rows, batch, lambda indices: self._bans(batch.seqs, indices))
        verified = self.spec_decoder.verify(rows, batch) if self.spec_decoder else Verified()
        sampled, tokens, conflicts = self._sample_pass(rows, batch)
        refused = {sampled[row].request_id: why for row, why in conflicts.items()}
        if verified.seqs:  # one token per sampled sequence, a run per verified one
            return sampled + verified.seqs, [*zip(tokens), *verified.tokens], forward_seconds, refused
        return sampled, list(zip(tokens)), forward_seconds, refused

    def _fail(self, faults: list[RequestFault]) -> list[RequestOutput]:
        """End each faulted request (KV blocks freed) with an error output naming the fault."""
        outputs = []
        for fault in faults:
            request = self.requests.pop(fault.request_id, None)
            if request is not None:
                self._finish_all(request)
                outputs.append(self._error_output(request, fault))
        return outputs

    def _refuse(self, refused: dict[str, str]) -> list[RequestOutput]:
        """End each refused request (request id -> why) with error_code 400 and its tokens so far."""
        outputs = []
        for request_id, why in sorted(refused.items()):
            self.fault_isolation.record(request_id, GUIDED_DECODING_CONFLICT, why)
            output = self.abort_request(request_id)
            if output is not None:
                output.error_code = INVALID_REQUEST
                output.error_msg = why
                outputs.append(output)
        return outputs

    def _output_or_fault(self, request: EngineRequest) -> RequestOutput:
        """`request_output`, or, when a plugin fails while building it (a reasoning parser that
        raises), an error output for this request alone, whose samples are then stopped."""
        try:
            return self.request_output(request)
        except Exception as exc:
            fault = self.fault_isolation.record(
                request.request_id, OUTPUT_PROCESSING, f"building the output failed: {describe(exc)}"
            )
            self._finish_all(request)
            return self._error_output(request, fault)

    @staticmethod
    def _error_output(request: EngineRequest, fault: RequestFault) -> RequestOutput:
        output = error_output(
            request.request_id, request.prompt, fault.message, request.arrival_time, INTERNAL_ERROR
        )
        output.prompt_token_ids = request.prompt_token_ids
        return output

    def _forced_reasoning_end(self, seq: Sequence, token: int) -> int:
        """Past `reasoning_max_tokens` of thinking, replace samples with the end-of-thinking tokens."""
        budget = seq.params.reasoning_max_tokens
        if budget is None or self.reasoning_parser is None or seq.num_output_tokens < budget:
            return token
        if not self.requests[seq.request_id].thinking_enabled:
            return token
        end = self.reasoning_parser.reasoning_end_token_ids()
        if not end:
            return token
        outputs = seq.output_token_ids
        for start in range(len(outputs) - len(end) + 1):
            if outputs[start : start + len(end)] == end:
                return token  # thinking already ended
        # how much of the end sequence is already written at the tail
        for done in range(len(end) - 1, 0, -1):
            if outputs[-done:] == end[:done]:
                return end[done]
        return end[0]

    def request_output(self, request: EngineRequest) -> RequestOutput:
        samples = self._completion_outputs(request)
        if self.reasoning_parser is not None:
            for sample in samples:
                split = self.reasoning_parser.split(
                    sample.text,
                    thinking_enabled=request.thinking_enabled,
                    finished=sample.finish_reason is not None,
                )
                sample.reasoning_content, sample.text = split.reasoning_content, split.content
                sample.tool_calls = split.tool_calls
        first = samples[0]
        if len(samples) > 1:
            first._samples = samples
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=first,
            finished=request.finished,
            metrics=self._metrics(request),
            num_cached_tokens=request.seqs[0].num_cached_tokens,
            num_input_image_tokens=request.multimodal.num_image_tokens if request.multimodal else 0,
            num_input_video_tokens=request.multimodal.num_video_tokens if request.multimodal else 0,
            prompt_logprobs=request.seqs[0].prompt_logprobs,
        )

    def _completion_outputs(self, request: EngineRequest) -> list[CompletionOutput]:
        """One output per returned sample: all samples, or the best `n` of best_of / beam search."""
        params = request.params
        search = request.beam_search
        if search is not None:
            aborted = request.finished and not search.done
            return [
                CompletionOutput(
                    index=index,
                    send_idx=len(hypothesis.token_ids),
                    token_ids=hypothesis.token_ids,
                    text=self.tokenizer.decode(
                        hypothesis.token_ids, skip_special_tokens=params.skip_special_tokens
                    ),
                    finish_reason="abort" if aborted else hypothesis.finish_reason if search.done else None,
                    logprobs=hypothesis.logprobs,
                    cumulative_logprob=hypothesis.cumulative_logprob,
                )
                for index, hypothesis in enumerate(search.results())
            ]
        seqs = request.seqs
        if params.num_samples > params.n and request.finished:
            seqs = sorted(seqs, key=lambda seq: -seq.cumulative_logprob)[: params.n]
        outputs = [completion_output(seq) for seq in seqs]
        for index, output in enumerate(outputs):
            output.index = index
        return outputs

    @staticmethod
    def _metrics(request: EngineRequest) -> RequestMetrics:
        seqs = request.seqs
        started = [seq.first_scheduled_time for seq in seqs if seq.first_scheduled_time is not None]
        first_tokens = [seq.first_token_time for seq in seqs if seq.first_token_time is not None]
        finished = [seq.finish_time for seq in seqs if seq.finish_time is not None]
        start = min(started) if started else None
        return RequestMetrics(
            arrival_time=request.arrival_time,
            inference_start_time=start,
            first_token_time=min(first_tokens) - request.arrival_time if first_tokens else None,
            time_in_queue=start - request.arrival_time if start is not None else None,
            model_forward_time=max(seq.forward_time for seq in seqs),
            model_execute_time=(max(finished) if finished else time.time()) - request.arrival_time,
            spec_num_verify_steps=sum(seq.spec_num_verify_steps for seq in seqs),
            spec_num_draft_tokens=sum(seq.spec_num_draft_tokens for seq in seqs),
            spec_num_accepted_tokens=sum(seq.spec_num_accepted_tokens for seq in seqs),
        )
