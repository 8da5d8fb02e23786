"""Scheduler and block manager: token budget, chunked prefill, slot limit, preemption."""

import numpy as np

from fastdeploy import SamplingParams
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.sequence import Sequence, SequenceStatus


def make_seq(seq_id: int, prompt_len: int) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        request_id=f"r{seq_id}",
        sample_index=0,
        prompt_token_ids=list(range(1, prompt_len + 1)),
        params=SamplingParams(),
        max_output_tokens=100,
        rng=np.random.default_rng(0),
        arrival_time=0.0,
    )


def run_step(scheduler: Scheduler, new_token: int = 7):
    """Schedule, then pretend the model ran: account computed tokens, append a token where due."""
    batch = scheduler.schedule()
    for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
        seq.num_computed_tokens += count
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(new_token)
    return batch


def test_block_manager_allocates_ceil_and_frees():
    manager = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq(0, 5)
    assert manager.extra_blocks_needed(seq, 5) == 2
    manager.allocate(seq, 5)
    assert len(seq.block_table) == 2 and manager.num_free_blocks == 2
    seq.num_computed_tokens = 5
    assert manager.extra_blocks_needed(seq, 3) == 0  # 8 tokens still fit 2 blocks
    assert manager.extra_blocks_needed(seq, 4) == 1
    assert manager.usage() == 0.5
    manager.free(seq)
    assert manager.num_free_blocks == 4 and seq.block_table == []


def test_long_prompt_is_prefilled_in_chunks_within_the_budget():
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=10)
    long_seq, short_seq = make_seq(0, 25), make_seq(1, 3)
    scheduler.add(long_seq)
    scheduler.add(short_seq)
    first = run_step(scheduler)
    assert first.num_new_tokens == [10]  # the long prompt takes the whole budget
    second = run_step(scheduler)
    assert second.num_new_tokens == [10]
    third = run_step(scheduler)
    # last 5 prompt tokens of the long prompt, then the short prompt fits in the rest of the budget
    assert [s.seq_id for s in third.seqs] == [0, 1] and third.num_new_tokens == [5, 3]
    fourth = run_step(scheduler)
    assert fourth.num_new_tokens == [1, 1]  # both decode together
    assert long_seq.num_output_tokens == 2 and short_seq.num_output_tokens == 2


def test_max_num_seqs_limits_the_running_set():
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=100)
    seqs = [make_seq(i, 3) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    batch = run_step(scheduler)
    assert [s.seq_id for s in batch.seqs] == [0, 1]
    assert seqs[2].status is SequenceStatus.WAITING
    scheduler.finish(seqs[0])
    batch = run_step(scheduler)
    assert [s.seq_id for s in batch.seqs] == [1, 2]


def test_newest_running_sequence_is_preempted_and_recomputed():
    manager = BlockManager(num_blocks=3, block_size=4)
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=100)
    old, new = make_seq(0, 4), make_seq(1, 4)
    scheduler.add(old)
    scheduler.add(new)
    run_step(scheduler)  # both prefilled: 1 block each, each now has 5 tokens
    assert manager.num_free_blocks == 1
    run_step(scheduler)  # old takes the last block for token 5; new cannot grow -> preempted
    assert scheduler.num_preemptions == 1
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0 and new.block_table == []
    assert scheduler.waiting[0] is new
    assert old.num_output_tokens == 2 and new.num_output_tokens == 1  # new keeps its sampled token
    scheduler.finish(old)
    batch = run_step(scheduler)
    # recomputation covers the prompt and the already generated token, then samples the next one
    assert batch.seqs == [new] and batch.num_new_tokens == [5]
    assert new.num_output_tokens == 2


def test_preemption_continues_until_the_sequence_fits():
    """A sequence that needs two more blocks preempts the two newest, each holding one."""
    manager = BlockManager(num_blocks=3, block_size=4)
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=100)
    first, second, third = make_seq(0, 4), make_seq(1, 4), make_seq(2, 4)
    for seq in (first, second, third):
        scheduler.add(seq)
    run_step(scheduler)  # one block each, none free
    first.token_ids.extend([9, 9, 9, 9])  # 9 tokens, 4 computed: 5 to compute in 3 blocks
    batch = run_step(scheduler)
    assert scheduler.num_preemptions == 2
    assert list(scheduler.waiting) == [second, third]
    assert batch.seqs == [first] and batch.num_new_tokens == [5]
    assert len(first.block_table) == 3
