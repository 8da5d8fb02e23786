"""Blocks computed elsewhere enter the prefix cache (`BlockManager.import_prefix`): a decode
instance of prefill/decode disaggregation holds them there until a sequence reuses them."""

import numpy as np

from fastdeploy import SamplingParams
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.sequence import Sequence


def make_seq(tokens) -> Sequence:
    return Sequence(0, "r", 0, list(tokens), SamplingParams(), 100, np.random.default_rng(0), 0.0)


def computed(manager: BlockManager, tokens) -> Sequence:
    seq = make_seq(tokens)
    manager.reuse_cached_prefix(seq)
    manager.allocate(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    manager.register_full_blocks(seq)
    return seq


def test_the_cached_prefix_is_found_by_tokens_alone():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    seq = computed(manager, range(10))  # blocks [0..3] and [4..7] registered
    assert manager.cached_prefix(list(range(8))) == seq.block_table[:2]
    assert manager.cached_prefix([0, 1, 2, 3, 9, 9, 9, 9]) == seq.block_table[:1]
    assert manager.cached_prefix([9, 1, 2, 3]) == []
    assert BlockManager(8, 4, enable_prefix_caching=False).cached_prefix(list(range(8))) == []


def test_imported_blocks_extend_the_cached_prefix_and_a_later_sequence_reuses_them_all():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    owner = computed(manager, range(6))  # block [0..3] registered
    first = owner.block_table[0]
    manager.free(owner)
    tokens = [*range(4), 20, 21, 22, 23, 30, 31, 32, 33]
    held, fresh = manager.import_prefix(tokens)
    assert held[0] == first and len(fresh) == 2 and held[1:] == fresh
    assert manager.num_free_blocks == 8 - 3
    later = make_seq([*tokens, 40])
    assert manager.reuse_cached_prefix(later) == 12 and later.block_table == held
    manager.release_blocks(held)
    assert all(manager.ref_count(block) == 1 for block in held)  # the sequence's own hold
    manager.free(later)
    assert manager.num_free_blocks == 8
    assert manager.cached_prefix(tokens) == held  # let go, still cached


def test_too_few_free_blocks_import_nothing():
    manager = BlockManager(num_blocks=3, block_size=4, enable_prefix_caching=True)
    owner = computed(manager, range(5))  # block [0..3] cached, 2 blocks in use
    assert manager.import_prefix([*range(4), *range(10, 22)]) is None  # 3 fresh blocks, 1 free
    assert manager.ref_count(owner.block_table[0]) == 1 and manager.num_free_blocks == 1
