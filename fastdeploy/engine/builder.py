"""Building an engine's parts: backend, checkpoint, limits, executor, KV cache, features, stepper.

`LLMEngine.__init__` calls these in order: `prepare` (before the tokenizer: the backend, the
checkpoint's config and the limits derived from it; rank processes start loading here),
`load_model` (after it: the model and its KV cache, in this process or in the rank processes),
then `build_features` and `choose_stepper`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastdeploy.backends.base import Backend, BackendOptions, Capability, KVCacheSpec
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.backends.selection import build_backend_of, select_backend_class
from fastdeploy.config import EngineConfig, ModelConfig
from fastdeploy.engine.async_scheduling import AsyncStepper
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.fault_isolation import describe
from fastdeploy.engine.generation_defaults import read_generation_defaults
from fastdeploy.engine.kv_groups import GroupedBlockManager
from fastdeploy.engine.pipeline import PipelineStepper
from fastdeploy.engine.request_ends import RequestEnds
from fastdeploy.engine.sampling_rules import EngineLimits
from fastdeploy.engine.stepper import StepCore, Stepper, SyncStepper
from fastdeploy.errors import InvalidArgumentError, KVCacheAllocationError
from fastdeploy.executor.base import Executor
from fastdeploy.executor.local import LocalExecutor
from fastdeploy.executor.rank_executor import DistributedExecutor
from fastdeploy.executor.startup import start_executor
from fastdeploy.input.processor import InputProcessor
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.kv_cache_planner import plan_kv_cache, plan_kv_cache_groups
from fastdeploy.model_executor.lora import LoRAManager
from fastdeploy.model_executor.model_loader import (
    CheckpointInfo,
    build_model,
    check_backend_kv_cache_dtype,
    check_backend_quantization,
    check_model_quantization,
    inspect_checkpoint,
)
from fastdeploy.model_resolver import resolve_model
from fastdeploy.models.base import CausalLM, KVCacheGroup
from fastdeploy.plugins.registry import PluginRegistry, get_registry

logger = get_logger(__name__)


@dataclass
class EngineSetup:
    """What is known before the tokenizer loads."""

    registry: PluginRegistry
    #: the backend the engine samples with (the cpu ops when the model runs in rank processes)
    backend: Backend
    model_path: str
    checkpoint: CheckpointInfo
    model_config: ModelConfig
    #: SamplingParams fields the checkpoint's generation_config.json sets, for unset ones
    generation_defaults: dict[str, Any]
    max_model_len: int
    max_num_batched_tokens: int
    max_logprobs: int
    #: the rank processes, when the model runs in them (they load while the tokenizer loads)
    remote: DistributedExecutor | None


def prepare(config: EngineConfig) -> EngineSetup:
    registry = get_registry()
    backend_class = select_backend_class(config.device, registry)
    if config.runs_in_rank_processes:
        # the ranks send the logits to the host: the engine samples them with the cpu ops
        backend: Backend = CpuBackend(BackendOptions(threads=1))
    else:
        backend = build_backend_of(
            backend_class, BackendOptions(threads=config.cpu_threads, dtype=config.dtype)
        )
        check_backend_quantization(config.quantization, backend)
        check_backend_kv_cache_dtype(config, backend)
    model_path = resolve_model(config.model, config.revision, config.gguf_file)
    checkpoint = inspect_checkpoint(model_path, registry)
    check_model_quantization(config.quantization, config.quantization_group_size, checkpoint, backend_class)
    model_config = checkpoint.config
    max_model_len = resolve_max_model_len(config, model_config, backend)
    max_num_batched_tokens = config.max_num_batched_tokens or default_chunk(
        model_config, max_model_len, backend_class.default_max_num_batched_tokens
    )
    vocab = model_config.vocab_size
    remote = (
        start_executor(config, checkpoint, max_model_len, max_num_batched_tokens, registry)
        if config.runs_in_rank_processes
        else None
    )
    return EngineSetup(
        registry,
        backend,
        model_path,
        checkpoint,
        model_config,
        read_generation_defaults(model_path, config.generation_config),
        max_model_len,
        max_num_batched_tokens,
        vocab if config.max_logprobs == -1 else min(config.max_logprobs, vocab),
        remote,
    )


def resolve_max_model_len(config: EngineConfig, model_config: ModelConfig, backend: Backend) -> int:
    model_limit = model_config.max_position_embeddings
    if config.max_model_len is None:
        return model_limit
    if config.max_model_len > model_limit:
        logger.warning(
            "max_model_len %d exceeds the model's max_position_embeddings %d",
            config.max_model_len,
            model_limit,
        )
        # the rotary tables (cos and sin, float32) are built for every position up front
        table_bytes = config.max_model_len * model_config.head_dim * 8
        free = backend.free_memory_bytes()
        if table_bytes > free:
            raise InvalidArgumentError(
                f"max_model_len={config.max_model_len} would need {table_bytes / 2**30:.1f} GiB of "
                f"rotary tables alone, more than the {free / 2**30:.1f} GiB free; the model was trained "
                f"for {model_limit} positions"
            )
    return config.max_model_len


def default_chunk(model_config: ModelConfig, max_model_len: int, backend_default: int) -> int:
    """`max_num_batched_tokens` when unset: a whole prompt in one pass (`max_model_len`, at least
    the backend's default), except where a sliding window binds: a pass's keys are all cached
    before its queries attend, so sliding layers hold a window and a chunk per sequence, and
    chunks of the backend's default keep that small."""
    window = int(model_config.raw.get("sliding_window") or 0)
    # Qwen's configs name a window they switch off (`use_sliding_window: false`)
    if 0 < window < max_model_len and model_config.raw.get("use_sliding_window", True) is not False:
        return backend_default
    return max(max_model_len, backend_default)


@dataclass
class LoadedModel:
    """The model where it runs and its KV cache's block manager."""

    executor: Executor
    block_manager: BlockManager
    #: the model, when it runs in this process
    model: Any = None
    kv_cache_spec: KVCacheSpec | None = None
    #: its LoRA adapters' slots (`enable_lora`)
    lora: LoRAManager | None = None
    #: the layer groups with a KV pool each (`CausalLM.kv_cache_groups`), where there are several
    kv_groups: list[KVCacheGroup] | None = None


def load_model(config: EngineConfig, setup: EngineSetup, inputs: InputProcessor) -> LoadedModel:
    """The model and its KV cache: here, or in the rank processes (which size their own caches);
    an in-process model's media processor joins `inputs`."""
    if setup.remote is not None:
        num_blocks = setup.remote.wait_ready()
        manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        return LoadedModel(setup.remote, manager)
    backend = setup.backend
    model = build_model(
        setup.checkpoint,
        backend,
        setup.max_model_len,
        setup.registry,
        quantization=config.quantization,
        quantization_group_size=config.quantization_group_size,
    )
    inputs.attach_media(setup.registry, model, setup.model_config, config)
    # rank processes (above) keep every block in one group: their managers release none
    groups = model.kv_cache_groups()
    if len(groups) > 1:
        spec, manager, kv_caches = _grouped_kv_cache(config, setup, model, groups)
    else:
        window = groups[0].window
        spec = plan_kv_cache(
            config, backend, setup.max_model_len, model, setup.max_num_batched_tokens, window=window
        )
        manager = BlockManager(spec.num_blocks, spec.block_size, config.enable_prefix_caching, window)
        kv_caches = allocate_kv_cache(backend, spec)
    graphs = None
    if (
        not config.enforce_eager
        and config.runner == "generate"  # the pooling runner never decodes
        and len(groups) == 1  # a captured step replays one block table per sequence
        and backend.supports(Capability.GRAPH_CAPTURE)
        and getattr(model, "supports_decode_graphs", True)
    ):
        graphs = backend.decode_graphs(
            model, kv_caches, spec.block_size, config.max_num_seqs, setup.max_model_len
        )
    lora = (
        LoRAManager(model, backend, config.max_loras, config.max_lora_rank, config.max_cpu_loras)
        if config.enable_lora
        else None
    )
    executor = LocalExecutor(model, backend, kv_caches, spec, graphs, lora, groups)
    return LoadedModel(executor, manager, model, spec, lora, groups if len(groups) > 1 else None)


def _grouped_kv_cache(
    config: EngineConfig, setup: EngineSetup, model: CausalLM, groups: list[KVCacheGroup]
) -> tuple[KVCacheSpec, GroupedBlockManager, list[Any]]:
    """A pool, a block manager and the layers' caches for each of the model's KV-cache groups;
    the spec returned is the whole model's (every layer) with the whole-context group's count."""
    specs = plan_kv_cache_groups(
        config, setup.backend, setup.max_model_len, model, setup.max_num_batched_tokens, groups
    )
    manager = GroupedBlockManager(
        [spec.num_blocks for spec in specs],
        [group.window for group in groups],
        config.block_size,
        config.enable_prefix_caching,
    )
    kv_caches: list[Any] = [None] * sum(len(group.layers) for group in groups)
    for spec, group in zip(specs, groups, strict=True):
        for index, cache in zip(group.layers, allocate_kv_cache(setup.backend, spec), strict=True):
            kv_caches[index] = cache
    whole = dataclasses.replace(specs[0], num_layers=len(kv_caches))
    return whole, manager, kv_caches


def allocate_kv_cache(backend: Backend, spec: KVCacheSpec) -> list[Any]:
    try:
        return backend.allocate_kv_cache(spec)
    except Exception as exc:
        size = spec.num_blocks * spec.bytes_per_block()
        raise KVCacheAllocationError(
            f"the {backend.name} backend could not allocate the KV cache ({spec.num_blocks} blocks, "
            f"{size / 2**20:.0f} MiB): {describe(exc)}; lower kv_cache_memory, gpu_memory_utilization "
            "or num_gpu_blocks_override"
        ) from exc


def engine_limits(config: EngineConfig, setup: EngineSetup) -> EngineLimits:
    """What the engine can serve (`sampling_rules.check_engine_limits`)."""
    remote = setup.remote
    backend_class = remote.backend_class if remote is not None else type(setup.backend)
    return EngineLimits(
        setup.max_model_len,
        setup.model_config.vocab_size,
        setup.max_logprobs,
        config.max_num_seqs,
        config.device,
        config.pipeline_parallel_size > 1,
        backend_class.supports(Capability.KV_BLOCK_COPY),
    )


def async_scheduling_on(config: EngineConfig, backend: Backend) -> bool:
    """Steps overlap (`engine/async_scheduling.py`) where passes run beside the host."""
    if config.async_scheduling is not None:
        return config.async_scheduling
    return type(backend).supports(Capability.OVERLAPS_HOST) and config.async_scheduling_blocker() is None


def choose_stepper(
    config: EngineConfig,
    core: StepCore,
    executor: Executor,
    overlappable: Callable[[ScheduledBatch], bool],
    ends: RequestEnds,
    in_flight: set[Any],
) -> Stepper:
    """The step mode, chosen once: pipeline stages (their sequences kept in `in_flight`, the
    scheduler's set), overlapped steps, or one pass at a time."""
    if config.pipeline_parallel_size > 1:
        return PipelineStepper(core, executor, config.pipeline_parallel_size, in_flight)  # type: ignore[arg-type]
    if async_scheduling_on(config, core.backend):
        return AsyncStepper(core, executor, overlappable, ends)
    return SyncStepper(core, executor)
