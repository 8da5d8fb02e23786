"""Blocks behind a sliding window (every layer's) are released: what stays held, the table's
aliases, frees, forks and prefix caching around them, and the planner's smaller cache."""

from __future__ import annotations

import numpy as np

from fastdeploy import SamplingParams
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.sequence import Sequence
from fastdeploy.model_executor.kv_cache_planner import tokens_held


def make_seq(seq_id: int, tokens) -> Sequence:
    return Sequence(seq_id, "r", 0, list(tokens), SamplingParams(), 100, np.random.default_rng(0), 0.0)


def step(manager: BlockManager, seq: Sequence, count: int) -> None:
    """What the scheduler and engine do for `count` new tokens."""
    assert manager.can_allocate(seq, count)
    manager.allocate(seq, count)
    seq.num_computed_tokens += count
    manager.register_full_blocks(seq)


def test_blocks_wholly_behind_the_window_and_its_margin_block_are_released():
    # window 6 over 4-slot blocks: the query at position p sees p-5..p
    manager = BlockManager(num_blocks=20, block_size=4, window=6)
    seq = make_seq(0, range(40))
    step(manager, seq, 13)  # prefill positions 0..12: 4 blocks, nothing released yet
    assert manager.num_free_blocks == 16
    for _ in range(27):  # decode positions 13..39 one at a time
        query = seq.num_computed_tokens
        step(manager, seq, 1)
        # the query at `query` sees query-5..query: the block holding query-5, the one before it
        # (a pass may still be in flight) and all after are held, each once; the rest released
        first = max(0, (query - 5) // 4 - 1)
        live = seq.block_table[first:]
        assert len(set(live)) == len(live)
        assert all(manager.ref_count(block) == 1 for block in live)
        assert 20 - manager.num_free_blocks == len(live)
    # 40 positions = 10 table entries; the window and its margin need at most 4 blocks
    assert len(seq.block_table) == 10
    assert 20 - manager.num_free_blocks <= 4
    # released entries alias a block the sequence still holds (the table keeps its positions)
    assert all(manager.ref_count(block) == 1 for block in seq.block_table)
    manager.free(seq)
    assert manager.num_free_blocks == 20


def test_without_a_window_every_block_stays():
    manager = BlockManager(num_blocks=20, block_size=4)
    seq = make_seq(0, range(40))
    step(manager, seq, 13)
    for _ in range(27):
        step(manager, seq, 1)
    assert 20 - manager.num_free_blocks == 10


def test_forked_beams_keep_shared_blocks_and_free_the_rest_once():
    manager = BlockManager(num_blocks=30, block_size=4, window=6)
    parent, child = make_seq(0, range(30)), make_seq(1, [])
    step(manager, parent, 8)
    manager.fork(parent, child)
    child.token_ids, child.num_computed_tokens = list(parent.token_ids), parent.num_computed_tokens
    for _ in range(16):  # both decode; their first two blocks stay shared, so neither releases them
        step(manager, parent, 1)
        step(manager, child, 1)
    assert manager.ref_count(parent.block_table[0]) == 2
    manager.free(parent)
    manager.free(child)
    assert manager.num_free_blocks == 30


def test_prefix_caching_keeps_the_blocks_its_keys_still_name():
    """A block is released only after the block after it is registered (keys name their parent)."""
    manager = BlockManager(num_blocks=30, block_size=4, enable_prefix_caching=True, window=6)
    seq = make_seq(0, range(30))
    step(manager, seq, 30)
    step(manager, seq, 0)  # the next pass releases what the window left behind
    assert seq.num_registered_blocks == 7
    assert 30 - manager.num_free_blocks < 8
    # a second sequence with the same prompt still reuses the cached prefix (released blocks
    # are cached, evictable, not lost)
    other = make_seq(1, range(30))
    assert manager.reuse_cached_prefix(other) == 28


def test_the_planner_sizes_a_sequence_by_its_window_and_chunk():
    assert tokens_held(0, 4096, 512, 16) == 4096
    assert tokens_held(1024, 4096, 512, 16) == 1024 + 512 + 48
    assert tokens_held(4096, 2048, 512, 16) == 2048
