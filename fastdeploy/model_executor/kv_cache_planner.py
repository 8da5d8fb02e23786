"""Sizes the paged KV cache from the memory left after the weights are loaded."""

from __future__ import annotations

import dataclasses

from fastdeploy.backends.base import Backend, KVCacheSpec
from fastdeploy.backends.profiling import profiled_kv_cache_budget
from fastdeploy.config import EngineConfig
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.logger import get_logger
from fastdeploy.models.base import CausalLM, KVCacheGroup

logger = get_logger(__name__)

#: share of free memory the KV cache may take when the user sets nothing, per backend
DEFAULT_UTILIZATION = {"cpu": 0.5}
FALLBACK_UTILIZATION = 0.9


def tokens_held(window: int, max_model_len: int, max_num_batched_tokens: int, block_size: int) -> int:
    """Cache slots one sequence holds at most: all of `max_model_len`, or in layers with a sliding
    window (every layer's, `CausalLM.kv_window`, or a group's, `CausalLM.kv_cache_groups`) the
    window, a prefill chunk and the block manager's margin (three blocks: the window's partial
    first block, one kept for a pass in flight, a partial last)."""
    if not window:
        return max_model_len
    return min(max_model_len, window + max_num_batched_tokens + 3 * block_size)


def _budget(
    config: EngineConfig,
    backend: Backend,
    model: CausalLM,
    spec: KVCacheSpec,
    max_num_batched_tokens: int,
    max_model_len: int,
    memory_share: float,
) -> int:
    """Bytes the KV cache may take: `kv_cache_memory`, else `gpu_memory_utilization` (the
    backend's default share) of the memory a profiling pass leaves, or of the free memory."""
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    utilization = memory_share * (
        config.gpu_memory_utilization or DEFAULT_UTILIZATION.get(backend.name, FALLBACK_UTILIZATION)
    )
    budget = profiled_kv_cache_budget(
        model, backend, spec, utilization, max_num_batched_tokens, max_model_len
    )
    return int(backend.free_memory_bytes() * utilization) if budget is None else budget


def _check_fits(
    config: EngineConfig, backend: Backend, num_bytes: int, per_block: int, num_blocks: int
) -> None:
    """Only an explicit size can ask for more than is free: refuse it, naming the setting."""
    free = backend.free_memory_bytes()
    if num_bytes <= free:
        return
    asked = (
        f"num_gpu_blocks_override={config.num_gpu_blocks_override}"
        if config.num_gpu_blocks_override is not None
        else f"kv_cache_memory={config.kv_cache_memory}"
    )
    raise InvalidArgumentError(
        f"{asked} asks for {num_blocks} KV blocks of {per_block / 2**20:.1f} MiB "
        f"({num_bytes / 2**30:.1f} GiB), more than the {free / 2**30:.1f} GiB free on "
        f"{backend.name}; ask for fewer"
    )


def _check_holds(
    config: EngineConfig, max_model_len: int, num_blocks: int, held: int, what: str = ""
) -> None:
    capacity = num_blocks * config.block_size
    if capacity < held:
        needs = (
            f"max_model_len={max_model_len}" if held == max_model_len else f"the {held} one sequence holds"
        )
        raise InvalidArgumentError(
            f"the KV cache{what} holds {capacity} tokens ({num_blocks} blocks of {config.block_size}), fewer "
            f"than {needs}; lower max_model_len or give the cache more memory "
            "(kv_cache_memory, gpu_memory_utilization or num_gpu_blocks_override)"
        )


def _cache_dtype(config: EngineConfig, backend: Backend) -> str:
    # "auto" caches in the compute dtype, which the backend has resolved by now
    return backend.options.dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype


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
    spec = model.kv_cache_spec(0, config.block_size, _cache_dtype(config, backend))
    per_block = spec.bytes_per_block()
    held = tokens_held(window, max_model_len, max_num_batched_tokens, config.block_size)
    if config.num_gpu_blocks_override is not None:
        num_blocks = config.num_gpu_blocks_override
    else:
        budget = _budget(config, backend, model, spec, max_num_batched_tokens, max_model_len, memory_share)
        blocks_per_seq = -(-held // config.block_size)
        num_blocks = min(budget // per_block, blocks_per_seq * config.max_num_seqs)
    logger.info(
        "Doing profile, the total_block_num:%d (block_size %d, %.1f MiB per block, %.1f GiB free)",
        num_blocks,
        config.block_size,
        per_block / 2**20,
        backend.free_memory_bytes() / 2**30,
    )
    _check_fits(config, backend, num_blocks * per_block, per_block, num_blocks)
    _check_holds(config, max_model_len, num_blocks, held)
    return dataclasses.replace(spec, num_blocks=num_blocks)


def split_blocks(budget: int, per_block: list[int], held: list[int], max_num_seqs: int) -> list[int]:
    """Blocks of each KV-cache group's pool from `budget` bytes, the groups' blocks costing
    `per_block` bytes and one sequence holding at most `held` blocks of each.

    The group holding the most per sequence (the whole-context one) is the bound on context
    length; each other (sliding) group gets what one shared table would give it (budget over the
    summed block sizes), at most a window for each of `max_num_seqs` sequences, and less where
    that leaves the first group too few blocks for one longest sequence. The first group takes
    the rest, up to `max_num_seqs` longest sequences.
    """
    first = max(range(len(held)), key=held.__getitem__)
    shared = budget // sum(per_block)
    counts = [min(shared, count * max_num_seqs) for count in held]
    others = [i for i in range(len(held)) if i != first]
    spent = sum(counts[i] * per_block[i] for i in others)
    room = budget - held[first] * per_block[first]  # what the others may take beside one longest sequence
    if others and spent > room:
        scale = max(room, 0) / spent
        for i in others:
            counts[i] = max(held[i], int(counts[i] * scale))
        spent = sum(counts[i] * per_block[i] for i in others)
    counts[first] = max(0, min(held[first] * max_num_seqs, (budget - spent) // per_block[first]))
    return counts


def plan_kv_cache_groups(
    config: EngineConfig,
    backend: Backend,
    max_model_len: int,
    model: CausalLM,
    max_num_batched_tokens: int,
    groups: list[KVCacheGroup],
) -> list[KVCacheSpec]:
    """Each KV-cache group's pool (`CausalLM.kv_cache_groups`: sliding layers hold only their
    window and a prefill chunk per sequence), from one budget (`plan_kv_cache`'s) split by
    `split_blocks`; `num_gpu_blocks_override` gives every group that many blocks. Each group's
    memory is logged, and the first group's count as FastDeploy logs it (`total_block_num`)."""
    whole = model.kv_cache_spec(0, config.block_size, _cache_dtype(config, backend))
    specs = [dataclasses.replace(whole, num_layers=len(group.layers)) for group in groups]
    per_block = [spec.bytes_per_block() for spec in specs]
    held = [
        tokens_held(group.window, max_model_len, max_num_batched_tokens, config.block_size)
        for group in groups
    ]
    held_blocks = [-(-tokens // config.block_size) for tokens in held]
    if config.num_gpu_blocks_override is not None:
        counts = [config.num_gpu_blocks_override] * len(groups)
    else:
        budget = _budget(config, backend, model, whole, max_num_batched_tokens, max_model_len, 1.0)
        counts = split_blocks(budget, per_block, held_blocks, config.max_num_seqs)
    total = sum(count * size for count, size in zip(counts, per_block, strict=True))
    logger.info(
        "Doing profile, the total_block_num:%d (block_size %d, the whole-context layer group's; %.1f GiB free)",
        counts[0],
        config.block_size,
        backend.free_memory_bytes() / 2**30,
    )
    for index, (group, count, size) in enumerate(zip(groups, counts, per_block, strict=True)):
        logger.info(
            "KV cache group %d (%s, %d layers): %d blocks of %d tokens, %.1f MiB; a sequence holds at most %d tokens here",
            index,
            f"sliding window {group.window}" if group.window else "whole context",
            len(group.layers),
            count,
            config.block_size,
            count * size / 2**20,
            held[index],
        )
    _check_fits(config, backend, total, max(per_block), sum(counts))
    for index, (count, tokens) in enumerate(zip(counts, held, strict=True)):
        _check_holds(config, max_model_len, count, tokens, f" of layer group {index}")
    return [dataclasses.replace(spec, num_blocks=count) for spec, count in zip(specs, counts, strict=True)]
