"""The profiling run: one forward pass over the largest batch, before the KV cache exists.

Accelerator backends measure their peak activation memory with it (`Backend.kv_cache_budget_bytes`)
so the KV cache can take the rest. The pass is a single prefill of `num_tokens` tokens (the
engine's `max_num_batched_tokens`, the most one step ever computes) into a scratch cache just
large enough for it, plus the logits of each sequence's last row, as a real step would compute.
The tokens are split into sequences of at most `max_model_len` tokens: a position past the
model's length would index past its rotary table (on a GPU, an out-of-bounds read).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend, BatchLayout, KVCacheSpec


def profile_layout(num_tokens: int, block_size: int, max_model_len: int) -> BatchLayout:
    """Sequences of `max_model_len` tokens (the last one shorter) prefilling `num_tokens` tokens
    (id 0) in all, each into its own consecutive blocks."""
    lengths = [max_model_len] * (num_tokens // max_model_len)
    if num_tokens % max_model_len:
        lengths.append(num_tokens % max_model_len)
    blocks_per_seq = -(-max(lengths) // block_size)
    positions = np.concatenate([np.arange(length, dtype=np.int64) for length in lengths])
    first_slots = np.repeat(np.arange(len(lengths), dtype=np.int64) * blocks_per_seq * block_size, lengths)
    return BatchLayout(
        input_ids=np.zeros(num_tokens, dtype=np.int64),
        positions=positions,
        slot_mapping=first_slots + positions,
        query_lens=np.array(lengths, dtype=np.int64),
        context_lens=np.array(lengths, dtype=np.int64),
        block_tables=np.arange(len(lengths) * blocks_per_seq, dtype=np.int64).reshape(len(lengths), -1),
        logits_indices=np.cumsum(lengths, dtype=np.int64) - 1,
        block_size=block_size,
    )


def dummy_forward(
    model: Any, backend: Backend, num_tokens: int, spec: KVCacheSpec, max_model_len: int
) -> Any:
    """Run the model once over `num_tokens` tokens with a scratch KV cache; returns the logits."""
    layout = profile_layout(num_tokens, spec.block_size, max_model_len)
    scratch = backend.allocate_kv_cache(dataclasses.replace(spec, num_blocks=layout.block_tables.size))
    hidden = model.forward(
        backend.from_numpy(layout.input_ids),
        backend.from_numpy(layout.positions),
        backend.prepare_batch(layout),
        scratch,
    )
    rows = backend.gather_rows(hidden, backend.from_numpy(layout.logits_indices))
    return model.compute_logits(rows)


def profiled_kv_cache_budget(
    model: Any, backend: Backend, spec: KVCacheSpec, utilization: float, num_tokens: int, max_model_len: int
) -> int | None:
    """The KV-cache budget an accelerator backend measures with one `dummy_forward` of
    `num_tokens` tokens; None for host backends (the planner then takes utilization x free)."""
    return backend.kv_cache_budget_bytes(
        utilization, lambda: dummy_forward(model, backend, num_tokens, spec, max_model_len)
    )
