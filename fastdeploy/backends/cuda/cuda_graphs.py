"""CUDA graphs for decode steps, one per batch-size bucket, as vLLM and FastDeploy capture them.

A decode step launches a few hundred small kernels; replaying them as one graph removes the
per-launch CPU cost that dominates small batches. A step whose sequences all decode one token
(`query_len == 1`) and that fits the largest bucket is padded up to the next bucket and replayed:

- every input of the graph lives in a static buffer sized for the largest bucket (token ids,
  positions, KV slots, block tables for `max_model_len`, context lengths, and each row's sampling
  settings and uniform); a step copies its values into the first rows and pads the rest (slot -1:
  nothing written; context 0: attention over nothing, a zero row; greedy), so whatever blocks the
  block manager hands out (prefix-cache hits, blocks of resumed preempted sequences) are read
  through the step's own block tables. The copies come from pinned host memory, two sets used in
  turn, without waiting for the device (`step_inputs`);
- the split-KV decode kernel's split count is fixed per bucket at capture and each program
  derives its range from the sequence's context length, so one graph serves any context up to
  `max_model_len`;
- the forward graph ends with every row's argmax and broken flag (its maximum not finite); a
  step with drawn rows (temperature / top-k / top-p) also replays the bucket's sampling stage,
  captured on first use, which reads the forward graph's logits and the static settings. Either
  way the host reads one [n, 2] int64 copy of (token id, broken): the step's only device-to-host
  transfer (`engine/pass_sampling.py`);
- outputs (logits, ids, pairs) are overwritten by each replay; the first `n` rows are the step's.

Prefill and mixed steps run eagerly, as does everything with `enforce_eager=True`; when the
engine lets a pass sample itself, an eager pass runs the same sampling stage on its logits
(`sample_eager`), so replayed and eager steps give the same tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.backends.base import BatchLayout, PendingTokens
from fastdeploy.backends.cuda.attention_metadata import CudaBatch
from fastdeploy.backends.cuda.runtimes.base import DeviceGraph
from fastdeploy.backends.cuda.step_inputs import StagedBuffers
from fastdeploy.backends.types import SamplingRows
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


#: the step's int64 inputs, rows of one [len, largest] buffer
_INT64_ROWS = ("input_ids", "positions", "slot_mapping", "greedy")
#: int32 and float32 ones
_INT32_ROWS = ("context_lens", "top_k")
_FLOAT_ROWS = ("temperature", "top_p", "uniform")


@dataclass
class CapturedStep:
    """One bucket's graphs and the static tensors their replays overwrite."""

    forward: DeviceGraph
    logits: Any
    #: greedy ids [size] and (id, broken) pairs [size, 2] of the forward graph
    greedy: tuple[Any, Any]
    #: the sampling stage over `logits` (each row's draw or argmax), captured on first use
    draws: DeviceGraph | None = None
    drawn: tuple[Any, Any] | None = None


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
        self.inputs = StagedBuffers(
            rt,
            {
                "int64": ([len(_INT64_ROWS), largest], "int64"),
                "int32": ([len(_INT32_ROWS), largest], "int32"),
                "float32": ([len(_FLOAT_ROWS), largest], "float32"),
                "block_tables": ([largest, self.max_blocks], "int32"),
            },
        )
        device = self.inputs.device
        self.static = {
            **{name: device["int64"][i] for i, name in enumerate(_INT64_ROWS)},
            **{name: device["int32"][i] for i, name in enumerate(_INT32_ROWS)},
            **{name: device["float32"][i] for i, name in enumerate(_FLOAT_ROWS)},
            "block_tables": device["block_tables"],
        }
        rows = np.arange(largest, dtype=np.int32)
        self.rows = rt.from_numpy(rows)  # decode i is token row i of sequence i
        self.rows_int64 = rt.from_numpy(rows.astype(np.int64))  # index_copy_ indices
        self.ones = rt.from_numpy(np.ones(largest, np.int32))
        self.no_tiles = rt.from_numpy(np.zeros(0, np.int32))
        self.graphs: dict[int, CapturedStep] = {}
        self.replays = 0

    def _batch(self, size: int) -> CudaBatch:
        """Metadata views of the static buffers for a bucket."""
        attention = self.backend.launch.attention
        return CudaBatch(
            slot_mapping=self.static["slot_mapping"][:size],
            block_size=self.block_size,
            block_tables=self.static["block_tables"][:size],
            seq_query_start=self.rows[:size],
            seq_query_len=self.ones[:size],
            seq_context_len=self.static["context_lens"][:size],
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

    def _sampling_rows(self, size: int) -> dict[str, Any]:
        names = ("greedy", "temperature", "top_k", "top_p", "uniform")
        return {name: self.static[name][:size] for name in names}

    def _step(self, size: int) -> Callable[[], Any]:
        """The forward graph's work: the logits, then every row's argmax and broken flag."""
        batch = self._batch(size)
        static = self.static

        def forward() -> Any:
            hidden = self.model.forward(
                static["input_ids"][:size], static["positions"][:size], batch, self.kv_caches
            )
            logits = self.model.compute_logits(hidden)
            return (logits, *self.backend.pass_tokens(logits, {}, draws=False))

        return forward

    def capture(self) -> None:
        """Capture every bucket's forward graph, largest first (smaller ones reuse its memory
        pool)."""
        start = time.perf_counter()
        self._fill(None, None)
        for size in reversed(self.buckets):
            forward = self._step(size)
            forward()  # compiles the Triton kernels and warms the allocator outside the capture
            graph = self.new_graph()
            logits, ids, pairs = graph.capture(forward)
            self.graphs[size] = CapturedStep(graph, logits, (ids, pairs))
        logger.info(
            "captured CUDA graphs for decode batches of %s sequences in %.1f s",
            ", ".join(map(str, self.buckets)),
            time.perf_counter() - start,
        )

    def _capture_draws(self, step: CapturedStep, size: int) -> None:
        """The bucket's sampling stage, captured the first time a step of that size draws (greedy
        servers never pay for it); it follows the forward graph's replay on the device's queue."""
        rows = self._sampling_rows(size)

        def draw() -> Any:
            return self.backend.pass_tokens(step.logits, rows, draws=True)

        draw()  # compiles the sampling kernels outside the capture
        step.draws = self.new_graph()
        step.drawn = step.draws.capture(draw)

    def _fill(self, layout: BatchLayout | None, sampling: SamplingRows | None) -> None:
        """Write a step's inputs into the next host buffers, padding the other rows (slot -1:
        nothing written; context 0: attention over nothing; greedy), and queue their copies into
        the static buffers (of the block tables, only the step's rows: padding rows read none)."""
        host = self.inputs.host_arrays()
        ints, int32s, floats = host["int64"], host["int32"], host["float32"]
        ints[:] = 0
        ints[2] = -1  # slot_mapping
        ints[3] = 1  # greedy
        int32s[:] = 0
        floats[:] = 1.0  # temperature, top_p
        floats[2] = 0.0  # uniform
        count = 0 if layout is None else layout.query_lens.size
        if count:
            ints[0, :count] = layout.input_ids
            ints[1, :count] = layout.positions
            ints[2, :count] = layout.slot_mapping
            int32s[0, :count] = layout.context_lens
            width = layout.block_tables.shape[1]
            tables = host["block_tables"]
            tables[:count, :width] = layout.block_tables
            tables[:count, width:] = 0
        if sampling is not None and count:
            ints[3, :count] = sampling.greedy
            int32s[1, :count] = sampling.top_k
            floats[0, :count] = sampling.kernel_temperature
            floats[1, :count] = sampling.top_p
            floats[2, :count] = sampling.uniform
        self.inputs.upload({"block_tables": max(count, 1)} if layout is not None else None)

    def run(
        self, layout: BatchLayout, input_ids: Any = None, sampling: SamplingRows | None = None
    ) -> Any | None:
        """Logits [n, vocab] of a decode-only step replayed from its bucket's graph, or None
        when this step must run eagerly (prefill or mixed, or more sequences than any bucket).
        `input_ids` (device [n]), when given, replace `layout.input_ids`. With `sampling`, the
        result is (logits, PendingTokens): the graphs sampled the rows too, and the host reads
        the ids and broken flags in one copy."""
        if not is_decode_only(layout) or layout.block_tables.shape[1] > self.max_blocks:
            return None
        count = layout.query_lens.size
        size = bucket_for(count, self.buckets)
        if size is None or size not in self.graphs:
            return None
        self._fill(layout, sampling)
        if input_ids is not None:
            self.backend.rt.index_copy_(self.static["input_ids"], self.rows_int64[:count], input_ids)
        step = self.graphs[size]
        step.forward.replay()
        self.replays += 1
        logits = step.logits[:count]
        if sampling is None:
            return logits
        ids, pairs = step.greedy
        if sampling.any_drawn:
            if step.draws is None:
                self._capture_draws(step, size)
            step.draws.replay()
            ids, pairs = step.drawn
        return logits, pending_pairs(self.backend.rt, ids[:count], pairs[:count])

    def sample_eager(self, logits: Any, sampling: SamplingRows) -> PendingTokens:
        """The tokens of an eager pass's logits [n, vocab], sampled by the same device stage as a
        replay (so both give the same tokens), read by the host in one copy."""
        put = self.backend.rt.from_numpy
        rows = {
            "greedy": put(sampling.greedy.astype(np.int64)),
            "temperature": put(sampling.kernel_temperature),
            "top_k": put(sampling.top_k.astype(np.int32)),
            "top_p": put(sampling.top_p.astype(np.float32)),
            "uniform": put(sampling.uniform.astype(np.float32)),
        }
        ids, pairs = self.backend.pass_tokens(logits, rows, draws=sampling.any_drawn)
        return pending_pairs(self.backend.rt, ids, pairs)


def pending_pairs(rt: Any, ids: Any, pairs: Any) -> PendingTokens:
    """`PendingTokens` of device ids and their (id, broken) pairs, whose copy to the host starts
    now on the device's queue: the step's one device-to-host transfer."""
    copied = rt.copy_to_host_later([pairs])

    def wait() -> tuple[np.ndarray, np.ndarray]:
        (host,) = copied()
        return host[:, 0].astype(np.int64), host[:, 1] != 0

    return PendingTokens(ids, wait)
