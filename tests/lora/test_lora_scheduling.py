"""The scheduler puts at most `max_loras` adapters in a pass (the others wait, and run later);
prefix-cache keys differ by adapter; LoRA's row segments group rows by slot."""

from __future__ import annotations

import numpy as np

from fastdeploy import LoRARequest, SamplingParams
from fastdeploy.backends.lora import segments_by_slot
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.sequence import Sequence


def make_seq(seq_id: int, lora: LoRARequest | None, prompt_len: int = 3) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        request_id=f"r{seq_id}",
        sample_index=0,
        prompt_token_ids=list(range(1, prompt_len + 1)),
        params=SamplingParams(),
        max_output_tokens=100,
        rng=np.random.default_rng(0),
        arrival_time=0.0,
        lora=lora,
    )


def adapters_of(batch) -> set[int]:
    return {seq.lora.lora_int_id for seq in batch.seqs if seq.lora is not None}


def test_at_most_max_loras_adapters_per_pass_and_none_is_dropped():
    loras = [LoRARequest(f"a{i}", i + 1, "/adapters") for i in range(3)]
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=16, max_num_batched_tokens=64, max_loras=2)
    seqs = [make_seq(i, loras[i % 3] if i % 4 else None) for i in range(8)]
    for seq in seqs:
        scheduler.add(seq)
    done: set[int] = set()
    for _ in range(20):
        batch = scheduler.schedule()
        assert len(adapters_of(batch)) <= 2
        for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += count
            done.add(seq.seq_id)
            if seq.lora is not None and seq.lora.lora_int_id in {1, 2}:
                scheduler.finish(seq)  # the first adapters finish; the third must then run
    assert done == {seq.seq_id for seq in seqs}


def test_prefix_cache_keys_differ_by_adapter():
    manager = BlockManager(16, 4, enable_prefix_caching=True)
    base, first, second = (
        make_seq(i, lora, 9)
        for i, lora in enumerate([None, LoRARequest("a", 1, "/a"), LoRARequest("b", 2, "/b")])
    )
    keys = {manager._key(seq, 0) for seq in (base, first, second)}
    assert len(keys) == 3
    assert manager._key(first, 0) == manager._key(make_seq(9, LoRARequest("a", 1, "/a"), 9), 0)


def test_segments_group_rows_by_slot():
    grouped = segments_by_slot(np.array([2, -1, 0, 2, 0, -1], np.int64))
    assert grouped.rows.tolist() == [2, 4, 0, 3] and grouped.segments == ((0, 0, 2), (2, 2, 4))
    contiguous = segments_by_slot(np.array([-1, 1, 1, 3], np.int64))
    assert contiguous.rows == slice(1, 4) and contiguous.segments == ((1, 0, 2), (3, 2, 3))
    assert segments_by_slot(np.array([-1, -1], np.int64)).count == 0
