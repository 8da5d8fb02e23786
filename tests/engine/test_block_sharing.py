"""Reference counts and copy-on-write of KV blocks shared by forked beams, through forks, frees,
prefix caching and preemption."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fastdeploy import SamplingParams
from fastdeploy.backends.base import BatchLayout, KVCacheSpec
from fastdeploy.backends.conformance import build_backend
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.scheduler import Scheduler
from fastdeploy.engine.sequence import Sequence


def make_seq(seq_id: int, tokens) -> Sequence:
    return Sequence(seq_id, "r", 0, list(tokens), SamplingParams(), 100, np.random.default_rng(0), 0.0)


def compute(manager: BlockManager, seq: Sequence, count: int | None = None) -> None:
    """What the scheduler and engine do for `count` new tokens (default: all uncomputed ones)."""
    count = seq.num_tokens - seq.num_computed_tokens if count is None else count
    assert manager.can_allocate(seq, count)
    manager.allocate(seq, count)
    seq.num_computed_tokens += count
    manager.register_full_blocks(seq)


def fork(manager: BlockManager, parent: Sequence, child: Sequence) -> None:
    """What beam search does: the child takes the parent's blocks, tokens and progress."""
    manager.fork(parent, child)
    child.token_ids = list(parent.token_ids)
    child.num_computed_tokens = parent.num_computed_tokens


def assert_counts_match_tables(manager: BlockManager, seqs: list[Sequence]) -> None:
    """Every block's count is the number of tables holding it; the others are free or cached."""
    held = Counter(block for seq in seqs for block in seq.block_table)
    for block in range(manager.num_blocks):
        assert manager.ref_count(block) == held[block], block
    assert manager.num_free_blocks == manager.num_blocks - len(held)


def test_fork_shares_every_block_and_copies_only_the_partial_one_on_write():
    manager = BlockManager(num_blocks=10, block_size=4)
    parent, child = make_seq(0, range(10)), make_seq(1, [])
    compute(manager, parent)  # blocks: 4 + 4 + 2 tokens
    fork(manager, parent, child)
    assert child.block_table == parent.block_table
    assert_counts_match_tables(manager, [parent, child])
    assert manager.take_pending_copies() == []  # nothing copied at fork time
    parent.token_ids.append(50)
    child.token_ids.append(60)
    compute(manager, parent, 1)  # writes slot 2 of the shared partial block: parent gets a copy
    (copy,) = manager.take_pending_copies()
    assert copy == (child.block_table[2], parent.block_table[2])
    assert parent.block_table[:2] == child.block_table[:2]
    compute(manager, child, 1)  # the block is the child's alone now: written in place
    assert manager.take_pending_copies() == []
    assert_counts_match_tables(manager, [parent, child])
    manager.free(parent)
    assert_counts_match_tables(manager, [child])
    manager.free(child)
    assert manager.num_free_blocks == 10


def test_a_fork_at_a_block_boundary_copies_nothing():
    manager = BlockManager(num_blocks=6, block_size=4)
    parent, child = make_seq(0, range(8)), make_seq(1, [])
    compute(manager, parent)
    fork(manager, parent, child)
    for seq, token in ((parent, 1), (child, 2)):
        seq.token_ids.append(token)
        compute(manager, seq, 1)
    assert manager.take_pending_copies() == []
    assert parent.block_table[2] != child.block_table[2]
    assert_counts_match_tables(manager, [parent, child])


def test_copy_on_write_counts_towards_can_allocate():
    manager = BlockManager(num_blocks=3, block_size=4)
    parent, child = make_seq(0, range(10)), make_seq(1, [])
    compute(manager, parent)
    fork(manager, parent, child)
    child.token_ids.append(5)
    assert manager.extra_blocks_needed(child, 1) == 1
    assert not manager.can_allocate(child, 1)  # the copy needs a block and none is free


def test_refork_onto_a_released_beam_frees_its_old_blocks():
    manager = BlockManager(num_blocks=12, block_size=4)
    first, second = make_seq(0, range(6)), make_seq(1, [])
    compute(manager, first)
    fork(manager, first, second)
    for seq, token in ((first, 7), (second, 8)):
        seq.token_ids.extend([token] * 4)
        compute(manager, seq)
    assert_counts_match_tables(manager, [first, second])
    fork(manager, first, second)  # `second` dies, `first` has two children: `second` is reused
    assert second.block_table == first.block_table
    assert_counts_match_tables(manager, [first, second])


def test_shared_prefix_cached_blocks_and_forks_together():
    manager = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=True)
    a, b = make_seq(0, range(9)), make_seq(1, [])
    compute(manager, a)
    fork(manager, a, b)
    later = make_seq(2, [*range(8), 42, 43])
    assert manager.reuse_cached_prefix(later) == 8
    assert later.block_table == a.block_table[:2]
    compute(manager, later)
    assert_counts_match_tables(manager, [a, b, later])
    for seq in (a, b, later):
        manager.free(seq)
    assert manager.num_free_blocks == 12


def test_preempting_a_forked_beam_keeps_its_siblings_blocks():
    manager = BlockManager(num_blocks=4, block_size=4)
    scheduler = Scheduler(manager, max_num_seqs=8, max_num_batched_tokens=64)
    root = make_seq(0, range(6))
    scheduler.add(root)
    batch = scheduler.schedule()
    root.num_computed_tokens += batch.num_new_tokens[0]
    beams = [root] + [make_seq(i, []) for i in (1, 2, 3)]
    for beam in beams[1:]:
        fork(manager, root, beam)
        scheduler.add_fork(beam, root)
    for index, beam in enumerate(beams):
        beam.token_ids.append(100 + index)
    assert_counts_match_tables(manager, beams)
    # each beam writes into the shared partial block: two copies take the 2 free blocks, the
    # newest beam is preempted, and the third writes the block it now holds alone
    batch = scheduler.schedule()
    assert scheduler.num_preemptions == 1 and len(batch.seqs) == 3
    assert len(batch.block_copies) == len(batch.seqs) - 1  # the last writer keeps the original
    running = [seq for seq in beams if seq in scheduler.running]
    assert_counts_match_tables(manager, running)
    for seq in beams:
        scheduler.finish(seq)
    assert manager.num_free_blocks == 4


def _one_sequence_layout(table: list[int], start: int, end: int, block: int) -> BatchLayout:
    positions = np.arange(start, end)
    return BatchLayout(
        input_ids=np.zeros(end - start, dtype=np.int64),
        positions=positions,
        slot_mapping=np.asarray(table)[positions // block] * block + positions % block,
        query_lens=np.array([end - start]),
        context_lens=np.array([end]),
        block_tables=np.array([table]),
        logits_indices=np.array([0]),
        block_size=block,
    )


@pytest.mark.parametrize("kernels", ["auto", "numpy"])
@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16", "bfloat16", "int8"])
def test_a_copied_block_reads_as_its_source_in_every_kv_cache_dtype(monkeypatch, kernels, kv_cache_dtype):
    """The cpu backend's copy-on-write copies all of a block (int8 caches: the scales too), in the
    native kernels' layout and the numpy one: attention over the copy equals attention over the
    source, bit for bit."""
    monkeypatch.setenv("FD_CPU_KERNELS", kernels)
    backend = build_backend("cpu", threads=1)
    if kernels == "auto" and backend.native_isa is None:
        pytest.skip("no native kernels on this machine")
    block, dim = 4, 8
    spec = KVCacheSpec(
        num_layers=1, num_blocks=4, block_size=block, num_kv_heads=1, head_dim=dim, dtype=kv_cache_dtype
    )
    (cache,) = backend.allocate_kv_cache(spec)
    rng = np.random.default_rng(7)

    def attend(table: list[int], start: int, end: int, k: np.ndarray, v: np.ndarray, q=None) -> np.ndarray:
        q = rng.standard_normal((end - start, 2, dim), dtype=np.float32) if q is None else q
        layout = backend.prepare_batch(_one_sequence_layout(table, start, end, block))
        return backend.to_numpy(backend.attention(q, k, v, cache, layout, 0.5))

    prefix = rng.standard_normal((2, 3, 1, dim), dtype=np.float32)
    attend([2], 0, 3, prefix[0], prefix[1])  # 3 slots of block 2 written
    backend.copy_kv_blocks([cache], np.array([[2, 0]], dtype=np.int64), block)
    q = rng.standard_normal((1, 2, dim), dtype=np.float32)
    k, v = rng.standard_normal((2, 1, 1, dim), dtype=np.float32)
    from_copy = attend([0], 3, 4, k, v, q)  # the fork writes its next token into the copy
    from_source = attend([2], 3, 4, k, v, q)
    np.testing.assert_array_equal(from_copy, from_source)
