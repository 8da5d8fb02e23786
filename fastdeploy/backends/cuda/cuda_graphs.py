"""CUDA graphs for decode steps, one per batch-size bucket, as vLLM and FastDeploy capture them.

A decode step launches a few hundred small kernels; replaying them as one graph removes the
per-launch CPU cost that dominates small batches. A step whose sequences all decode one token
(`query_len == 1`) and that fits the largest bucket is padded up to the next bucket and replayed:

- every input of the graph lives in a static buffer sized for the largest bucket (token ids,
  positions, KV slots, block tables for `max_model_len`, context lengths); a step copies its
  values into the first rows and pads the rest (slot -1: nothing written; context 0: attention
  over nothing, a zero row), so whatever blocks the block manager hands out (prefix-cache hits,
  blocks of resumed preempted sequences) are read through the step's own block tables;
- the split-KV decode kernel's split count is fixed per bucket at capture and each program
  derives its range from the sequence's context length, so one graph serves any context up to
  `max_model_len`;
- outputs (the logits of every row) are overwritten by each replay; the first `n` rows are the
  step's.

Prefill and mixed steps run eagerly, as does everything with `enforce_eager=True`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fastdeploy.backends.base import BatchLayout
from fastdeploy.backends.cuda.attention_metadata import CudaBatch
from fastdeploy.backends.cuda.runtimes.base import DeviceGraph
from fastdeploy.logger import get_logger

logger = get_logger(__name__)


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, every 16 up to 256, every 32 beyond; capped at
    max_num_seqs (which is always a bucket)."""
    sizes = (
        [1, 2, 4] + list(range(8, 65, 8)) + list(range(80, 257, 16)) + list(range(288, max_num_seqs + 1, 32))
    )
    return sorted({size for size in sizes if size < max_num_seqs} | {max_num_seqs})


def bucket_for(count: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding `count` rows, or None when the batch is larger than all."""
    for size in buckets:
        if size >= count:
            return size
    return None


def is_decode_only(layout: BatchLayout) -> bool:
    """Every sequence computes one token and samples from it (a one-token chunk in the middle of
    a prompt computes one token but samples nothing: the graph's logits rows would not match)."""
    count = layout.query_lens.size
    return bool(count) and bool((layout.query_lens == 1).all()) and layout.logits_indices.size == count


class DecodeGraphs:
    """Captured decode steps of one model on one backend (a `TensorBackend` with Triton kernels)."""

    def __init__(
        self,
        backend: Any,
        model: Any,
        kv_caches: list[Any],
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        new_graph: Callable[[], DeviceGraph] | None = None,
    ) -> None:
        self.backend = backend
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.buckets = batch_buckets(max_num_seqs)
        self.max_blocks = -(-max_model_len // block_size)
        self.max_model_len = max_model_len
        self.new_graph = new_graph or backend.rt.new_graph
        largest = self.buckets[-1]
        rt = backend.rt
        self.input_ids = rt.zeros([largest], "int64")
        self.positions = rt.zeros([largest], "int64")
        self.slot_mapping = rt.zeros([largest], "int64")
        self.block_tables = rt.zeros([largest, self.max_blocks], "int32")
        self.context_lens = rt.zeros([largest], "int32")
        rows = np.arange(largest, dtype=np.int32)
        self.rows = rt.from_numpy(rows)  # decode i is token row i of sequence i
        self.rows_int64 = rt.from_numpy(rows.astype(np.int64))  # index_copy_ indices
        self.ones = rt.from_numpy(np.ones(largest, np.int32))
        self.no_tiles = rt.from_numpy(np.zeros(0, np.int32))
        self.graphs: dict[int, tuple[DeviceGraph, Any]] = {}
        self.replays = 0

    def _batch(self, size: int) -> CudaBatch:
        """Metadata views of the static buffers for a bucket."""
        attention = self.backend.launch.attention
        return CudaBatch(
            slot_mapping=self.slot_mapping[:size],
            block_size=self.block_size,
            block_tables=self.block_tables[:size],
            seq_query_start=self.rows[:size],
            seq_query_len=self.ones[:size],
            seq_context_len=self.context_lens[:size],
            tile_seq=self.no_tiles,
            tile_offset=self.no_tiles,
            decode_token=self.rows[:size],
            decode_seq=self.rows[:size],
            num_prefill_tiles=0,
            num_decodes=size,
            num_splits=attention.decode_splits(
                size, max(self.backend.num_kv_heads, 1), self.max_model_len, self.backend.num_sms
            ),
        )

    def _step(self, size: int) -> Callable[[], Any]:
        batch = self._batch(size)

        def forward() -> Any:
            hidden = self.model.forward(self.input_ids[:size], self.positions[:size], batch, self.kv_caches)
            return self.model.compute_logits(hidden)

        return forward

    def capture(self) -> None:
        """Capture every bucket, largest first (smaller ones reuse its memory pool)."""
        start = time.perf_counter()
        self._fill(padding_only=True)
        for size in reversed(self.buckets):
            forward = self._step(size)
            forward()  # compiles the Triton kernels and warms the allocator outside the capture
            graph = self.new_graph()
            self.graphs[size] = (graph, graph.capture(forward))
        logger.info(
            "captured CUDA graphs for decode batches of %s sequences in %.1f s",
            ", ".join(map(str, self.buckets)),
            time.perf_counter() - start,
        )

    def _fill(self, layout: BatchLayout | None = None, padding_only: bool = False) -> None:
        """Copy a step's inputs into the static buffers, padding every other row."""
        largest = self.buckets[-1]
        count = 0 if padding_only or layout is None else layout.query_lens.size
        ids = np.zeros(largest, np.int64)
        positions = np.zeros(largest, np.int64)
        slots = np.full(largest, -1, np.int64)
        tables = np.zeros((largest, self.max_blocks), np.int32)
        contexts = np.zeros(largest, np.int32)
        if count:
            ids[:count] = layout.input_ids
            positions[:count] = layout.positions
            slots[:count] = layout.slot_mapping
            width = layout.block_tables.shape[1]
            tables[:count, :width] = layout.block_tables
            contexts[:count] = layout.context_lens
        rt = self.backend.rt
        for target, source in (
            (self.input_ids, ids),
            (self.positions, positions),
            (self.slot_mapping, slots),
            (self.block_tables, tables),
            (self.context_lens, contexts),
        ):
            rt.copy_from_host(target, source)

    def run(self, layout: BatchLayout, input_ids: Any = None) -> Any | None:
        """Logits [n, vocab] of a decode-only step replayed from its bucket's graph, or None
        when this step must run eagerly (prefill or mixed, or more sequences than any bucket).
        `input_ids` (device [n]), when given, replace `layout.input_ids`."""
        if not is_decode_only(layout) or layout.block_tables.shape[1] > self.max_blocks:
            return None
        count = layout.query_lens.size
        size = bucket_for(count, self.buckets)
        if size is None or size not in self.graphs:
            return None
        self._fill(layout)
        if input_ids is not None:
            self.backend.rt.index_copy_(self.input_ids, self.rows_int64[:count], input_ids)
        graph, logits = self.graphs[size]
        graph.replay()
        self.replays += 1
        return logits[:count]
