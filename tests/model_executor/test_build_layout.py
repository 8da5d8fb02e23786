"""build_layout (vectorised over the batch) against a per-sequence construction written out plainly."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.scheduler import ScheduledBatch
from fastdeploy.engine.sequence import Sequence
from fastdeploy.model_executor.model_runner import build_layout


def reference_layout(batch: ScheduledBatch, block_size: int) -> tuple[dict[str, np.ndarray], list[int]]:
    """One sequence at a time, token by token: the definition of the layout's fields."""
    fields: dict[str, list] = {name: [] for name in ("input_ids", "positions", "slot_mapping")}
    fields.update(query_lens=[], context_lens=[], logits_indices=[])
    width = max(len(seq.block_table) for seq in batch.seqs)
    tables = [seq.block_table + [0] * (width - len(seq.block_table)) for seq in batch.seqs]
    sampling = []
    for index, (seq, count) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
        for position in range(seq.num_computed_tokens, seq.num_computed_tokens + count):
            fields["input_ids"].append(seq.token_ids[position])
            fields["positions"].append(position)
            block = seq.block_table[position // block_size]
            fields["slot_mapping"].append(block * block_size + position % block_size)
        fields["query_lens"].append(count)
        fields["context_lens"].append(seq.num_computed_tokens + count)
        if seq.num_computed_tokens + count == len(seq.token_ids):
            fields["logits_indices"].append(len(fields["input_ids"]) - 1)
            sampling.append(index)
    arrays = {name: np.array(values, dtype=np.int64) for name, values in fields.items()}
    arrays["block_tables"] = np.array(tables, dtype=np.int64)
    return arrays, sampling


def random_sequence(rng: np.random.Generator, seq_id: int, kind: str, block_size: int, free: list[int]):
    """A sequence as the scheduler leaves it: decoding, mid-prefill (`chunk1`: a one-token chunk), or
    recomputing after preemption."""
    prompt = rng.integers(0, 1000, int(rng.integers(1, 5 * block_size))).tolist()
    seq = Sequence(seq_id, f"r{seq_id}", 0, prompt, SamplingParams(), 10_000, np.random.default_rng(0), 0.0)
    outputs = rng.integers(0, 1000, int(rng.integers(0, 3 * block_size))).tolist()
    if kind in ("prefill", "chunk1"):
        outputs = []
    seq.token_ids.extend(outputs)
    total = len(seq.token_ids)
    if kind == "decode":
        seq.num_computed_tokens, count = total - 1, 1
    elif kind == "prefill":  # a chunk somewhere in the prompt, maybe its last
        seq.num_computed_tokens = int(rng.integers(0, total))
        count = int(rng.integers(1, total - seq.num_computed_tokens + 1))
    elif kind == "chunk1":
        seq.num_computed_tokens, count = int(rng.integers(0, total)), 1
    else:  # preempted: recomputes prompt and outputs from scratch, maybe in a chunk
        seq.num_computed_tokens = 0
        count = int(rng.integers(1, total + 1))
    blocks = -(-(seq.num_computed_tokens + count) // block_size) + int(rng.integers(0, 2))
    seq.block_table = [free.pop() for _ in range(blocks)]
    return seq, count


@pytest.mark.parametrize(
    "kinds",
    [("decode",), ("prefill",), ("preempted",), ("decode", "chunk1"), ("decode", "prefill", "preempted")],
)
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_layout_matches_per_sequence_construction(kinds: tuple[str, ...], block_size: int) -> None:
    rng = np.random.default_rng(block_size * 31 + len(kinds))
    for _ in range(20):
        free = rng.permutation(100_000).tolist()
        batch = ScheduledBatch()
        for seq_id in range(int(rng.integers(1, 40))):
            seq, count = random_sequence(rng, seq_id, str(rng.choice(kinds)), block_size, free)
            batch.add(seq, count)
        layout, sampling = build_layout(batch, block_size)
        expected, expected_sampling = reference_layout(batch, block_size)
        assert sampling == expected_sampling
        assert layout.block_size == block_size
        for name, values in expected.items():
            actual = getattr(layout, name)
            assert actual.dtype == np.int64, name
            np.testing.assert_array_equal(actual, values, err_msg=name)


def test_single_decode_sequence() -> None:
    """Hand-computed: position 69 of a 64-slot-block sequence lives in its second block, slot 5."""
    seq = Sequence(0, "r", 0, list(range(60)), SamplingParams(), 100, np.random.default_rng(0), 0.0)
    seq.token_ids.extend(range(100, 110))
    seq.num_computed_tokens = 69
    seq.block_table = [7, 3]
    batch = ScheduledBatch()
    batch.add(seq, 1)
    layout, sampling = build_layout(batch, 64)
    assert sampling == [0]
    assert layout.input_ids.tolist() == [109]
    assert layout.positions.tolist() == [69]
    assert layout.slot_mapping.tolist() == [3 * 64 + 5]
    assert layout.context_lens.tolist() == [70]
    assert layout.logits_indices.tolist() == [0]
