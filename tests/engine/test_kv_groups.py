"""KV blocks per layer group (engine/kv_groups.py): a whole-context group keeps every block, a
sliding group frees what its window left behind; prefix hits, forks and frees across groups; the
planner's split of one budget between the groups' pools; the default prefill chunk of sliding models."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy import SamplingParams
from fastdeploy.config import ModelConfig
from fastdeploy.engine.builder import default_chunk
from fastdeploy.engine.kv_groups import GroupedBlockManager
from fastdeploy.engine.sequence import Sequence
from fastdeploy.model_executor.kv_cache_planner import split_blocks

BLOCK = 4
WINDOW = 6


def make_seq(seq_id: int, tokens) -> Sequence:
    return Sequence(seq_id, "r", 0, list(tokens), SamplingParams(), 100, np.random.default_rng(0), 0.0)


def grouped(full: int = 40, sliding: int = 40, caching: bool = False) -> GroupedBlockManager:
    return GroupedBlockManager([full, sliding], [0, WINDOW], BLOCK, caching)


def step(manager: GroupedBlockManager, seq: Sequence, count: int) -> None:
    """What the scheduler and engine do for `count` new tokens."""
    assert manager.can_allocate(seq, count)
    manager.allocate(seq, count)
    seq.num_computed_tokens += count
    manager.register_full_blocks(seq)


def assert_all_free(manager: GroupedBlockManager) -> None:
    for group in range(len(manager.managers)):
        assert manager.held_blocks(group) == 0


def test_the_sliding_group_holds_its_window_the_full_group_everything():
    manager = grouped()
    seq = make_seq(0, range(60))
    step(manager, seq, 13)
    for _ in range(47):
        step(manager, seq, 1)
        # the window (6 positions: 2 or 3 blocks) and one block of margin
        assert manager.held_blocks(1) <= WINDOW // BLOCK + 3
    assert manager.held_blocks(0) == 15  # 60 positions, all kept
    assert len(seq.block_table) == 15
    (part,) = manager.batch_groups([seq])
    table = part.tables[0].block_table
    assert len(table) == 15  # the sliding table keeps every position's entry (aliases before the window)
    assert len(set(table[-3:])) == 3 and manager.managers[1].ref_count(table[-1]) == 1
    manager.free(seq)
    assert_all_free(manager)


def test_a_sequence_grows_only_if_every_group_has_the_blocks():
    manager = grouped(full=40, sliding=2)
    seq = make_seq(0, range(20))
    assert not manager.can_allocate(seq, 12)  # 3 blocks: the full group has them, the sliding one not
    assert manager.extra_blocks_needed(seq, 12) == 3
    assert manager.can_allocate(seq, 8)


def test_forked_sequences_share_blocks_in_each_group_and_free_them_once():
    manager = grouped()
    parent, child = make_seq(0, range(30)), make_seq(1, [])
    step(manager, parent, 6)  # a partial second block: the fork's first write copies it
    manager.fork(parent, child)
    child.token_ids, child.num_computed_tokens = list(parent.token_ids), parent.num_computed_tokens
    step(manager, child, 1)
    assert manager.take_pending_copies()  # the whole-context group's copy-on-write
    (part,) = manager.batch_groups([child])
    assert len(part.copies) == 1  # and the sliding group's, for its own pool
    for _ in range(12):
        step(manager, parent, 1)
        step(manager, child, 1)
    manager.free(parent)
    manager.free(child)
    assert_all_free(manager)


def test_a_prefix_hit_is_every_groups_and_the_longer_hits_are_cut_back():
    manager = grouped(full=40, sliding=8, caching=True)
    first = make_seq(0, range(30))
    step(manager, first, 30)
    manager.free(first)
    # the full group kept all 7 whole blocks cached; the small sliding pool too (8 blocks, 8 used)
    again = make_seq(1, range(30))
    assert manager.reuse_cached_prefix(again) == 28
    step(manager, again, 2)
    manager.free(again)
    # a third sequence takes the sliding pool's cached blocks for other tokens, evicting the chain
    other = make_seq(2, range(100, 130))
    step(manager, other, 30)
    manager.free(other)
    late = make_seq(3, range(30))
    hit = manager.reuse_cached_prefix(late)
    full_view = late.block_table
    (part,) = manager.batch_groups([late])
    assert hit % BLOCK == 0 and hit < 28  # the sliding group lost the chain's first blocks
    assert late.num_computed_tokens == hit
    assert len(full_view) == len(part.tables[0].block_table) == hit // BLOCK
    step(manager, late, 30 - hit)
    manager.free(late)
    assert_all_free(manager)


def test_a_prefix_hit_needs_only_the_blocks_within_the_window_of_its_end():
    manager = grouped(full=40, sliding=8, caching=True)
    first = make_seq(0, range(30))
    step(manager, first, 28)
    step(manager, first, 1)  # releases sliding blocks 0-3 (behind the window), cached, evictable first
    step(manager, first, 1)
    manager.free(first)
    other = make_seq(1, range(100, 116))  # 4 sliding blocks: the free one, then 0-2 evicted
    step(manager, other, 16)
    manager.free(other)
    late = make_seq(2, range(30))
    # 7 whole blocks; continuing at position 28 reads 23-27 (window 6): blocks 5 and 6, and block 4 of
    # margin, still cached: the whole hit, though the chain's first blocks are gone
    assert manager.reuse_cached_prefix(late) == 28
    (part,) = manager.batch_groups([late])
    sliding = part.tables[0].block_table
    assert len(sliding) == 7 and sliding[:4] == [sliding[4]] * 4  # aliases before the window
    assert len(set(sliding)) == 3
    step(manager, late, 2)
    manager.free(late)
    assert_all_free(manager)


def test_preempted_sequences_give_back_every_groups_blocks():
    manager = grouped(full=12, sliding=12)
    one, two = make_seq(0, range(40)), make_seq(1, range(40))
    step(manager, one, 20)
    step(manager, two, 20)
    assert not manager.can_allocate(one, 20)
    manager.free(two)  # what the scheduler's preemption does
    two.num_computed_tokens = 0
    step(manager, one, 20)
    manager.free(one)
    assert_all_free(manager)


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        # plenty: the sliding pool holds a window per sequence (7 x 4), the full group the rest up to
        # 4 sequences of 16 blocks
        (10_000, [64, 28]),
        # 100 units: a shared table would give each group 100 // 2 = 50 blocks; the sliding group's
        # cap is 28, the full group takes 100 - 28 = 72, capped at 64
        (100, [64, 28]),
        # 60: shared 30, sliding capped at 28, the full group the 32 left
        (60, [32, 28]),
        # 30: shared 15; beside one longest sequence (16) only 14 remain: the sliding pool shrinks to
        # them, floored at one sequence's 7
        (30, [16, 14]),
    ],
)
def test_the_budget_split_between_a_full_and_a_sliding_group(budget, expected):
    # one unit per block in each group; a sequence holds 16 full and 7 sliding blocks; 4 sequences
    assert split_blocks(budget, [1, 1], [16, 7], 4) == expected


def test_a_sliding_group_of_many_layers_is_capped_by_its_windows():
    # Gemma-3-like: 1 full layer (1 unit a block), 5 sliding (5 units); 16 and 7 blocks a sequence
    # budget 200: shared 200 // 6 = 33 blocks; the sliding cap 7 x 2 = 14 (70 units); the full
    # group takes (200 - 70) // 1 = 130, capped at 16 x 2 = 32
    assert split_blocks(200, [1, 5], [16, 7], 2) == [32, 14]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"sliding_window": 512}, 2048),  # the window binds at 32k: chunks of the backend's default
        ({}, 32768),  # no window: a whole prompt in one pass
        ({"sliding_window": 512, "use_sliding_window": False}, 32768),  # Qwen: named, switched off
        ({"sliding_window": 65536}, 32768),  # a window beyond the context never binds
    ],
)
def test_sliding_models_prefill_in_chunks_unless_told_otherwise(overrides, expected):
    config = ModelConfig.from_hf_dict(
        {
            "architectures": ["Gemma3ForCausalLM"],
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 100,
        }
        | overrides
    )
    assert default_chunk(config, 32768, 2048) == expected
