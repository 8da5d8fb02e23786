"""Runs one scheduled batch through the model: builds the flat batch layout, returns logits."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend, BatchLayout
from fastdeploy.engine.scheduler import ScheduledBatch
from fastdeploy.models.base import CausalLM


def build_layout(batch: ScheduledBatch, block_size: int) -> tuple[BatchLayout, list[int]]:
    """The flat layout of `batch` and the indices (into batch.seqs) of sequences that sample now.

    A sequence samples when this pass computes its last known token (the end of its prompt, or
    of the prompt plus outputs after a preemption); mid-prompt chunks produce no token.
    """
    ids, positions, slots = [], [], []
    query_lens, context_lens, logits_rows, sampling = [], [], [], []
    max_blocks = max(len(seq.block_table) for seq in batch.seqs)
    tables = np.zeros((len(batch), max_blocks), dtype=np.int64)
    row = 0
    for i, (seq, count) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
        start = seq.num_computed_tokens
        end = start + count
        table = np.asarray(seq.block_table, dtype=np.int64)
        tables[i, : table.size] = table
        pos = np.arange(start, end, dtype=np.int64)
        ids.append(np.asarray(seq.token_ids[start:end], dtype=np.int64))
        positions.append(pos)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
        query_lens.append(count)
        context_lens.append(end)
        row += count
        if end == seq.num_tokens:
            logits_rows.append(row - 1)
            sampling.append(i)
    layout = BatchLayout(
        input_ids=np.concatenate(ids),
        positions=np.concatenate(positions),
        slot_mapping=np.concatenate(slots),
        query_lens=np.asarray(query_lens, dtype=np.int64),
        context_lens=np.asarray(context_lens, dtype=np.int64),
        block_tables=tables,
        logits_indices=np.asarray(logits_rows, dtype=np.int64),
        block_size=block_size,
    )
    return layout, sampling


class ModelRunner:
    """Owns the model and its KV cache on the backend."""

    def __init__(
        self, model: CausalLM, backend: Backend, kv_caches: list[Any], block_size: int, graphs: Any = None
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_size = block_size
        #: captured decode steps (`Backend.decode_graphs`), None when running eagerly
        self.graphs = graphs

    def execute(self, batch: ScheduledBatch) -> tuple[Any, list[int], float]:
        """(device logits [samplers, vocab] or None, indices of sampling sequences, forward seconds).

        Logits stay on the device: the engine samples there when the backend can, and copies
        them to the host otherwise.
        """
        layout, sampling = build_layout(batch, self.block_size)
        start = time.perf_counter()
        logits = self.run(layout)
        return logits, sampling, time.perf_counter() - start

    def run(self, layout: BatchLayout) -> Any:
        """Device logits of the rows `layout.logits_indices` names (None when it names none, or on
        a pipeline stage that hands its activations on instead).

        This is all a worker process of a multi-process model runs per step: the layout is
        host data and travels to the workers as it is.
        """
        if self.graphs is not None:
            logits = self.graphs.run(layout)
            if logits is not None:
                return logits
        backend = self.backend
        metadata = backend.prepare_batch(layout)
        hidden = self.model.forward(
            backend.from_numpy(layout.input_ids),
            backend.from_numpy(layout.positions),
            metadata,
            self.kv_caches,
        )
        if hidden is None or not layout.logits_indices.size:
            return None
        rows = backend.gather_rows(hidden, backend.from_numpy(layout.logits_indices))
        return self.model.compute_logits(rows)
