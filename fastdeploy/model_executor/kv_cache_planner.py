"""Sizes the paged KV cache from the memory left after the weights are loaded."""

from __future__ import annotations

import dataclasses

from fastdeploy.backends.base import Backend, KVCacheSpec
from fastdeploy.backends.profiling import profiled_kv_cache_budget
from fastdeploy.config import EngineConfig
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger
from fastdeploy.models.base import CausalLM

logger = get_logger(__name__)

#: share of free memory the KV cache may take when the user sets nothing, per backend
DEFAULT_UTILIZATION = {"cpu": 0.5}
FALLBACK_UTILIZATION = 0.9


def tokens_held(window: int, max_model_len: int, max_num_batched_tokens: int, block_size: int) -> int:
    """Cache slots one sequence holds at most: all of `max_model_len`, or with a sliding window on
    every layer (`CausalLM.kv_window`) the window, a prefill chunk and the block manager's margin
    (three blocks: the window's partial first block, one kept for a pass in flight, a partial last)."""
    if not window:
        return max_model_len
    return min(max_model_len, window + max_num_batched_tokens + 3 * block_size)


def plan_kv_cache(
    config: EngineConfig,
    backend: Backend,
    max_model_len: int,
    model: CausalLM,
    max_num_batched_tokens: int,
    memory_share: float = 1.0,
    window: int = 0,
) -> KVCacheSpec:
    """How many blocks to allocate, logged as FastDeploy does (`total_block_num`).

    The budget is `kv_cache_memory` bytes, else `gpu_memory_utilization` of the memory left after
    a profiling forward pass over `max_num_batched_tokens` tokens (accelerator backends measure
    it; host backends take that share of the free memory). It is capped at what `max_num_seqs`
    sequences of `max_model_len` tokens could ever use (with `window`, the sliding window of every
    layer where the block manager releases the blocks behind it: of the window plus a prefill
    chunk). `num_gpu_blocks_override` replaces the computed count. `memory_share` is this process's part of the free memory when several
    rank processes of one model share it (host backends). The model says what it caches per
    token (`CausalLM.kv_cache_spec`: its rank's layers and KV heads, or its latent vector).
    """
    # "auto" caches in the compute dtype, which the backend has resolved by now
    dtype = backend.options.dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype
    spec = model.kv_cache_spec(0, config.block_size, dtype)
    per_block = spec.bytes_per_block()
    free = backend.free_memory_bytes()
    held = tokens_held(window, max_model_len, max_num_batched_tokens, config.block_size)
    if config.num_gpu_blocks_override is not None:
        num_blocks = config.num_gpu_blocks_override
    else:
        if config.kv_cache_memory is not None:
            budget = config.kv_cache_memory
        else:
            utilization = memory_share * (
                config.gpu_memory_utilization or DEFAULT_UTILIZATION.get(backend.name, FALLBACK_UTILIZATION)
            )
            budget = profiled_kv_cache_budget(
                model, backend, spec, utilization, max_num_batched_tokens, max_model_len
            )
            if budget is None:
                budget = int(free * utilization)
        blocks_per_seq = -(-held // config.block_size)
        num_blocks = min(budget // per_block, blocks_per_seq * config.max_num_seqs)
    logger.info(
        "Doing profile, the total_block_num:%d (block_size %d, %.1f MiB per block, %.1f GiB free)",
        num_blocks,
        config.block_size,
        per_block / 2**20,
        free / 2**30,
    )
    if num_blocks * per_block > free:  # only an explicit size can ask for more than is free
        asked = (
            f"num_gpu_blocks_override={config.num_gpu_blocks_override}"
            if config.num_gpu_blocks_override is not None
            else f"kv_cache_memory={config.kv_cache_memory}"
        )
        raise InvalidArgumentError(
            f"{asked} asks for {num_blocks} KV blocks of {per_block / 2**20:.1f} MiB "
            f"({num_blocks * per_block / 2**30:.1f} GiB), more than the {free / 2**30:.1f} GiB free on "
            f"{backend.name}; ask for fewer"
        )
    capacity = num_blocks * config.block_size
    if capacity < held:
        needs = (
            f"max_model_len={max_model_len}" if held == max_model_len else f"the {held} one sequence holds"
        )
        raise InvalidArgumentError(
            f"the KV cache holds {capacity} tokens ({num_blocks} blocks of {config.block_size}), fewer than "
            f"{needs}; lower max_model_len or give the cache more memory "
            "(kv_cache_memory, gpu_memory_utilization or num_gpu_blocks_override)"
        )
    return dataclasses.replace(spec, num_blocks=num_blocks)
