"""Runs one scheduled batch through the model: builds the flat batch layout, returns logits."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend, BatchLayout
from fastdeploy.backends.types import GroupedBatch, SamplingRows
from fastdeploy.model_executor.batch import BatchSequence, ScheduledBatch
from fastdeploy.model_executor.lora.manager import LoRAManager
from fastdeploy.model_executor.pooling import pool_chunk, pooled_rows
from fastdeploy.models.base import CausalLM, KVCacheGroup


@dataclass(frozen=True)
class ExtraRows:
    """Positions of one batch sequence whose logits a pass returns besides its sampling rows: the
    prompt tokens it scores (`prompt_logprobs`) or the drafts it verifies (speculative decoding).
    They come after every sampling row, in batch order."""

    #: index into batch.seqs
    index: int
    #: absolute positions in the sequence, ascending; row `offset + i` holds `positions[i]`'s logits
    positions: np.ndarray
    offset: int


def extra_logits_rows(batch: ScheduledBatch, num_sampling: int) -> list[ExtraRows]:
    """The extra logits rows of `batch`, the pass's sampling rows being the first `num_sampling`.

    A pure function of the batch before its pass is applied, so the layout and the code reading
    the logits agree on the rows.
    """
    extras, offset = [], num_sampling
    counts = batch.num_new_tokens
    for index in sorted(batch.drafts.keys() | batch.scored.keys()):  # most passes have none
        start = batch.seqs[index].num_computed_tokens
        end = start + counts[index]
        drafts = batch.drafts.get(index)
        if drafts:  # the last token and each draft but the last: verify positions
            positions = np.arange(end - 1 - len(drafts), end - 1)
        else:  # position p scores prompt token p + 1
            first, last = batch.scored[index]
            positions = np.arange(max(start, first), min(end, last))
        if positions.size:
            extras.append(ExtraRows(index, positions, offset))
            offset += positions.size
    return extras


def build_layout(batch: ScheduledBatch, block_size: int) -> tuple[BatchLayout, list[int]]:
    """The flat layout of `batch` and the indices (into batch.seqs) of sequences that sample now.

    A sequence samples when this pass computes its last known token (the end of its prompt, or
    of the prompt plus outputs after a preemption) and its draft tokens, if it has any (they
    follow its tokens; speculative decoding verifies them); mid-prompt chunks produce no token.
    `logits_indices` names one row per sampling sequence, then the rows of `extra_logits_rows`.

    This runs every step for every running sequence, so the only per-sequence Python is reading
    a few attributes; positions, slots and sampling rows are computed for the whole batch at once.
    """
    seqs = batch.seqs
    if all(count == 1 for count in batch.num_new_tokens) and not extra_logits_rows(batch, len(seqs)):
        return _one_token_layout(batch, block_size)
    counts = np.asarray(batch.num_new_tokens, dtype=np.int64)
    starts = np.array([seq.num_computed_tokens for seq in seqs], dtype=np.int64)
    ends = starts + counts
    num_tokens = np.array([len(seq.token_ids) for seq in seqs], dtype=np.int64)
    input_ids: list[int] = []
    drafts = batch.drafts
    for index, (seq, start, end) in enumerate(zip(seqs, starts.tolist(), ends.tolist(), strict=True)):
        tokens = seq.token_ids
        input_ids.extend(tokens[start:end])
        if index in drafts:  # they follow the known tokens
            input_ids.extend(drafts[index][max(0, start - len(tokens)) : end - len(tokens)])
    row_ends = np.cumsum(counts)
    row_starts = row_ends - counts - starts  # the flat row of position p is row_starts[i] + p
    seq_of_row = np.repeat(np.arange(len(seqs)), counts)
    positions = np.arange(row_ends[-1], dtype=np.int64) - np.repeat(row_starts, counts)
    tables = _block_tables(seqs)
    slots = tables[seq_of_row, positions // block_size] * block_size + positions % block_size
    # past the known tokens only with drafts, whose pass always reaches the last draft
    sampling = np.flatnonzero(ends >= num_tokens)
    logits_indices = row_ends[sampling] - 1
    extras = extra_logits_rows(batch, sampling.size)
    if extras:
        logits_indices = np.concatenate(
            [logits_indices, *(row_starts[e.index] + e.positions for e in extras)]
        )
    layout = BatchLayout(
        input_ids=np.array(input_ids, dtype=np.int64),
        positions=positions,
        slot_mapping=slots,
        query_lens=counts,
        context_lens=ends,
        block_tables=tables,
        logits_indices=logits_indices,
        block_size=block_size,
        block_copies=np.asarray(batch.block_copies, dtype=np.int64).reshape(-1, 2),
    )
    return layout, sampling.tolist()


def _one_token_layout(batch: ScheduledBatch, block_size: int) -> tuple[BatchLayout, list[int]]:
    """`build_layout` of a pass in which every sequence computes one token and no extra rows (a
    decode step, or one-token prompt chunks), from Python lists: a dozen fewer numpy calls, which
    cost more than the arithmetic here (run right after a pass, numpy's code is out of the caches).
    With one token each, sequence i's row is i, and drafts (which always add rows) cannot occur."""
    seqs = batch.seqs
    positions = [seq.num_computed_tokens for seq in seqs]
    tables = [seq.block_table for seq in seqs]
    sampling = [
        i
        for i, (seq, position) in enumerate(zip(seqs, positions, strict=True))
        if position + 1 >= len(seq.token_ids)
    ]
    layout = BatchLayout(
        input_ids=np.array(
            [seq.token_ids[position] for seq, position in zip(seqs, positions, strict=True)], np.int64
        ),
        positions=np.array(positions, np.int64),
        slot_mapping=np.array(
            [
                table[p // block_size] * block_size + p % block_size
                for table, p in zip(tables, positions, strict=True)
            ],
            np.int64,
        ),
        query_lens=np.ones(len(seqs), np.int64),
        context_lens=np.array([p + 1 for p in positions], np.int64),
        block_tables=_block_tables(seqs),
        logits_indices=np.array(sampling, np.int64),
        block_size=block_size,
        block_copies=np.asarray(batch.block_copies, dtype=np.int64).reshape(-1, 2),
    )
    return layout, sampling


def group_layouts(batch: ScheduledBatch, layout: BatchLayout) -> list[BatchLayout]:
    """`layout` as each sliding KV-cache group of `batch` sees it (`ScheduledBatch.kv_groups`):
    the same tokens and positions, the group's block tables, slots and copies."""
    if not batch.kv_groups:
        return []
    block_size = layout.block_size
    rows = np.repeat(np.arange(len(batch.seqs)), layout.query_lens)
    positions = layout.positions
    layouts = []
    for group in batch.kv_groups:
        tables = _block_tables(group.tables)
        layouts.append(
            dataclasses.replace(
                layout,
                slot_mapping=tables[rows, positions // block_size] * block_size + positions % block_size,
                block_tables=tables,
                block_copies=np.asarray(group.copies, dtype=np.int64).reshape(-1, 2),
            )
        )
    return layouts


def _block_tables(seqs: list[BatchSequence]) -> np.ndarray:
    """[len(seqs), longest table] block ids, each row padded with 0."""
    tables = [seq.block_table for seq in seqs]
    width = max(len(table) for table in tables)
    if all(len(table) == width for table in tables):  # no padding (one sequence, say): 4x faster
        return np.array(tables, dtype=np.int64).reshape(len(tables), width)
    widths = np.array([len(table) for table in tables], dtype=np.int64)
    padded = np.zeros((len(tables), width), dtype=np.int64)
    flat = np.fromiter(chain.from_iterable(tables), np.int64, int(widths.sum()))
    padded[np.arange(width) < widths[:, None]] = flat
    return padded


def extra_model_inputs(batch: ScheduledBatch) -> dict[str, Any]:
    """`extra_inputs=[(seq.extra_inputs, first scheduled token, count), ...]` for the model's
    forward when any scheduled sequence carries extra inputs (a multimodal prompt); else nothing,
    so models without them keep the plain signature."""
    if all(seq.extra_inputs is None for seq in batch.seqs):
        return {}
    spans = [
        (seq.extra_inputs, seq.num_computed_tokens, count)
        for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True)
    ]
    return {"extra_inputs": spans}


class ModelRunner:
    """Owns the model and its KV cache on the backend."""

    def __init__(
        self,
        model: CausalLM,
        backend: Backend,
        kv_caches: list[Any],
        block_size: int,
        graphs: Any = None,
        lora: LoRAManager | None = None,
        kv_groups: list[KVCacheGroup] | None = None,
    ) -> None:
        self.model = model
        self.backend = backend
        #: one cache per layer of the model, in its order (each from its group's pool)
        self.kv_caches = kv_caches
        self.block_size = block_size
        #: the layer groups with a KV pool and block tables each (`CausalLM.kv_cache_groups`), the
        #: first on the sequences' own tables; None: one pool, one table for every layer
        self.kv_groups = kv_groups if kv_groups is not None and len(kv_groups) > 1 else None
        #: captured decode steps (`Backend.decode_graphs`), None when running eagerly
        self.graphs = graphs
        #: the resident LoRA adapters (`enable_lora`), None without
        self.lora = lora
        #: called after each `execute` with the batch and the pass's final hidden states [tokens,
        #: hidden] (device), when set: the MTP proposer drafts from the target's hidden states
        self.hidden_listener: Callable[[ScheduledBatch, Any], None] | None = None
        self._pass_hidden: Any = None

    def execute(
        self, batch: ScheduledBatch, feed: Callable[[BatchLayout], Any] | None = None
    ) -> tuple[Any, list[int], float]:
        """(device logits [samplers, vocab] or None, indices of sampling sequences, forward seconds).

        Logits stay on the device: the engine samples there when the backend can, and copies
        them to the host otherwise. `feed`, given, turns the layout into the pass's device input
        ids (async scheduling: some inputs are tokens still being sampled on the device).
        """
        layout, sampling = build_layout(batch, self.block_size)
        start = time.perf_counter()
        input_ids = None if feed is None else feed(layout)
        extra = extra_model_inputs(batch)
        adapters = self.lora.pass_layers(batch) if self.lora is not None else None
        if adapters is not None:  # a pass with LoRA adapters (never a captured graph)
            extra["lora"] = adapters
        rows = self._sampling_rows(batch, sampling)
        logits = self.run(layout, extra, input_ids, group_layouts(batch, layout), rows)
        if rows is not None:
            logits, batch.sampling.tokens = logits
        if self.hidden_listener is not None and self._pass_hidden is not None:
            self.hidden_listener(batch, self._pass_hidden)
            self._pass_hidden = None
        return logits, sampling, time.perf_counter() - start

    @property
    def samples_in_pass(self) -> bool:
        """Whether a pass given `ScheduledBatch.sampling` samples itself (with captured decode
        steps whose object can: a replay then yields the tokens, and eager passes use the same
        device stage, `sample_eager`)."""
        return self.graphs is not None and hasattr(self.graphs, "sample_eager")

    def _sampling_rows(self, batch: ScheduledBatch, sampling: list[int]) -> SamplingRows | None:
        if batch.sampling is None or not self.samples_in_pass or not sampling:
            return None
        return batch.sampling.rows(sampling)

    def run(
        self,
        layout: BatchLayout,
        extra: dict[str, Any] | None = None,
        input_ids: Any = None,
        groups: list[BatchLayout] | None = None,
        sampling: SamplingRows | None = None,
    ) -> Any:
        """Device logits of the rows `layout.logits_indices` names (None when it names none, or on
        a pipeline stage that hands its activations on instead).

        This is all a worker process of a multi-process model runs per step: the layout is
        host data and travels to the workers as it is. The layout's KV block copies are made
        first. `input_ids` (device), when given, replace `layout.input_ids`. `groups`: the
        sliding KV-cache groups' layouts (`group_layouts`), where the model has several groups.
        With `sampling` (only with captured graphs that sample) the result is (logits,
        PendingTokens of the sampled rows).
        """
        self._copy_blocks(layout, groups or [])
        # captured graphs take no extra inputs and keep their hidden states
        if self.graphs is not None and not extra and self.hidden_listener is None:
            args = (layout, input_ids) if sampling is None else (layout, input_ids, sampling)
            replayed = self.graphs.run(*args)
            if replayed is not None:
                return replayed
        hidden = self.hidden_states(layout, extra, input_ids, groups)
        if self.hidden_listener is not None:
            self._pass_hidden = hidden
        if hidden is None or not layout.logits_indices.size:
            return None
        backend = self.backend
        rows = backend.gather_rows(hidden, backend.from_numpy(layout.logits_indices))
        logits = self.model.compute_logits(rows)
        return logits if sampling is None else (logits, self.graphs.sample_eager(logits, sampling))

    def _copy_blocks(self, layout: BatchLayout, groups: list[BatchLayout]) -> None:
        """Make the pass's copy-on-write KV block copies, each group's in its own layers' pool."""
        if self.kv_groups is None:
            if layout.block_copies.size:
                self.backend.copy_kv_blocks(self.kv_caches, layout.block_copies, self.block_size)
            return
        for group, group_layout in zip(self.kv_groups, [layout, *groups], strict=True):
            if group_layout.block_copies.size:
                caches = [self.kv_caches[index] for index in group.layers]
                self.backend.copy_kv_blocks(caches, group_layout.block_copies, self.block_size)

    def hidden_states(
        self,
        layout: BatchLayout,
        extra: dict[str, Any] | None = None,
        input_ids: Any = None,
        groups: list[BatchLayout] | None = None,
    ) -> Any:
        """The model's final hidden states of every token of `layout` (device; None on a pipeline
        stage that hands its activations on). With `groups` (the sliding KV-cache groups'
        layouts) the model gets a `GroupedBatch`: each group's layout prepared."""
        backend = self.backend
        metadata = backend.prepare_batch(layout)
        if groups and self.kv_groups is not None:
            prepared = [metadata, *(backend.prepare_batch(group) for group in groups)]
            windows = [group.window for group in self.kv_groups]
            metadata = GroupedBatch(dict(zip(windows, prepared, strict=True)))
        return self.model.forward(
            backend.from_numpy(layout.input_ids) if input_ids is None else input_ids,
            backend.from_numpy(layout.positions),
            metadata,
            self.kv_caches,
            **(extra or {}),
        )

    def pool(self, batch: ScheduledBatch, pooling_type: str) -> tuple[np.ndarray, float]:
        """(per sequence of `batch`, what its chunk gives `pooling_type` [seqs, hidden] float32 on
        the host, forward seconds): the pooling runner's pass (`model_executor/pooling.py`).

        Only the rows the pooling reads come to the host: one per sequence for LAST and CLS."""
        layout, _ = build_layout(batch, self.block_size)
        start = time.perf_counter()
        hidden = self.hidden_states(layout, extra_model_inputs(batch), groups=group_layouts(batch, layout))
        backend = self.backend
        rows = pooled_rows(layout.query_lens, pooling_type)
        if rows is not None:
            pooled = backend.to_numpy(backend.gather_rows(hidden, backend.from_numpy(rows)))
        else:
            pooled = pool_chunk(backend.to_numpy(hidden), layout.query_lens, pooling_type)
        return np.asarray(pooled, dtype=np.float32), time.perf_counter() - start
