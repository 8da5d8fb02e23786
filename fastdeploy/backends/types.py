"""The data the device contract passes around: options, the KV cache's shape, a pass's layout.

Plain host values (numpy arrays, dataclasses) shared by the platform part, the ops part and the
engine; no device code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.config import KV_ITEM_BYTES


@dataclass(frozen=True)
class BackendOptions:
    """Settings a user can give any backend."""

    #: worker threads for host compute (None: every core this process may run on)
    threads: int | None = None
    #: data type for weights and activations; "auto" is replaced by the backend's
    #: `resolve_default_dtype()` before the backend is built
    dtype: str = "float32"

    def thread_count(self) -> int:
        """`threads`, or the cores this process may run on (its CPU affinity, which containers and
        `taskset` narrow; `os.cpu_count()` would count the whole host)."""
        if self.threads:
            return self.threads
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1


#: what a KV cache slot holds per layer: "kv", a key and a value vector of `head_dim` per KV head;
#: "latent", one vector of `head_dim` per token (multi-head latent attention: the compressed
#: latent then the rotary key part, read as keys and as values; `num_kv_heads` is 1)
KV_CACHE_KINDS = ("kv", "latent")


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV cache: `num_blocks` blocks of `block_size` token slots per layer."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float32"
    #: one of `KV_CACHE_KINDS`; a backend allocates a "latent" cache only if it declares
    #: `Capability.LATENT_ATTENTION`
    kind: str = "kv"

    def bytes_per_position(self) -> int:
        """Bytes one token slot takes across all layers (int8: with a float32 scale per vector)."""
        itemsize = KV_ITEM_BYTES.get(self.dtype) or np.dtype(self.dtype).itemsize
        per_vector = self.head_dim * itemsize + (4 if self.dtype == "int8" else 0)
        vectors = 1 if self.kind == "latent" else 2
        return vectors * self.num_layers * self.num_kv_heads * per_vector

    def bytes_per_block(self) -> int:
        """Bytes one block takes across all layers, keys and values (or latents)."""
        return self.block_size * self.bytes_per_position()


@dataclass
class BatchLayout:
    """Host-side description of one forward pass, built by the model runner.

    Tokens of all scheduled sequences are flattened in sequence order: sequence `i` contributes
    `query_lens[i]` tokens, whose positions end at `context_lens[i] - 1`.
    """

    input_ids: np.ndarray  # [num_tokens] int64
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64: KV slot each token's key/value is written to
    query_lens: np.ndarray  # [num_seqs] int64
    context_lens: np.ndarray  # [num_seqs] int64: tokens in the cache after this pass
    block_tables: np.ndarray  # [num_seqs, max_blocks] int64, padded with 0
    logits_indices: np.ndarray  # [num_logits] int64: token rows whose logits are needed
    block_size: int
    #: [n, 2] int64 (source, destination) KV blocks the model runner copies before the pass
    #: (`Backend.copy_kv_blocks`: beams that share blocks copy-on-write)
    block_copies: np.ndarray = field(default_factory=lambda: np.empty((0, 2), dtype=np.int64))


@dataclass(frozen=True)
class GroupedBatch:
    """A pass's prepared batches, one per KV-cache group, by the groups' sliding window (0: the
    layers that attend over the whole context).

    A model whose layers attend over different spans (Gemma 3, GPT-OSS: sliding and global
    layers) keeps one KV pool and one block table per sequence for each kind: the sliding layers'
    pool holds only each sequence's window. The model runner lays out and `prepare_batch`es the
    pass once per group and hands the model this object as its `batch`; the model gives each
    layer its group's with `layer_batch(batch, window)`. Backends never see it.
    """

    by_window: dict[int, Any]


def layer_batch(batch: Any, window: int) -> Any:
    """The prepared batch a layer with sliding `window` (0: none) attends with: its group's in a
    `GroupedBatch`, else `batch` itself (one group: every layer shares the block tables)."""
    if isinstance(batch, GroupedBatch):
        return batch.by_window[window]
    return batch


class PendingTokens:
    """Greedy tokens of a pass on their way to the host (async scheduling, `Backend.greedy_tokens`).

    `device` holds the tokens on the device ([rows] int64): the next pass reads its inputs from
    there before the host has them. `wait()` blocks until the pass is done and returns the host
    tokens and the rows `Backend.nonfinite_rows` marks (host bool [rows]).
    """

    def __init__(self, device: Any, wait: Callable[[], tuple[np.ndarray, np.ndarray]]) -> None:
        self.device = device
        self._wait = wait

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        return self._wait()


@dataclass
class SamplingRows:
    """How a pass samples its sampling rows itself (captured decode steps: one graph replay gives
    the token ids), one entry per row of `BatchLayout.logits_indices`, host arrays.

    A greedy row takes the argmax; the others the top-k / top-p draw of
    `Backend.sample_top_k_top_p` with their own uniform (drawn by the engine from the sequence's
    generator, so a seeded request samples the same tokens in a replayed, an eager or a host step).
    """

    greedy: np.ndarray  # [rows] bool
    temperature: np.ndarray  # [rows] float32 (> 0 where not greedy)
    top_k: np.ndarray  # [rows] int32, 0 = off
    top_p: np.ndarray  # [rows] float32
    uniform: np.ndarray  # [rows] float32 in [0, 1) (0 for greedy rows)

    @property
    def kernel_temperature(self) -> np.ndarray:
        """`temperature` with greedy rows at 1 (the sampling kernel divides by it; their draw is
        not used)."""
        return np.where(self.greedy, 1.0, self.temperature).astype(np.float32)

    @property
    def any_drawn(self) -> bool:
        """Whether any row samples (not only argmaxes)."""
        return not bool(self.greedy.all())
