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


def test_an_imported_partial_block_goes_whole_to_the_sequence_continuing_its_prompt():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    tokens = [*range(10, 14), 20, 21]  # one whole block and a partial one of 2 tokens
    held, fresh = manager.import_prefix(tokens)
    assert len(held) == 1 and fresh[0] == held[0] and len(fresh) == 2
    partial = fresh[1]
    assert manager.num_free_blocks == 8 - 2 and manager.ref_count(partial) == 1
    assert manager.cached_prefix(tokens) == held  # the partial block is in no cache
    other = make_seq([*range(10, 14), 20, 99, 7])  # the same whole block, another partial one
    assert manager.reuse_cached_prefix(other) == 4 and other.block_table == held
    later = make_seq([*tokens, 7])
    assert manager.reuse_cached_prefix(later) == 6  # only the last token is left to compute
    assert later.block_table == [held[0], partial] and manager.ref_count(partial) == 1
    assert manager.extra_blocks_needed(later, 1) == 0  # its own block: no copy before writing
    manager.drop_partial(partial)  # taken: nothing to drop
    manager.release_blocks(held)
    manager.free(later)
    manager.free(other)
    assert manager.num_free_blocks == 8


def test_an_untaken_partial_block_is_freed_by_drop_partial_and_two_wait_apart():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    _, (first,) = manager.import_prefix([1, 2, 3])
    _, (second,) = manager.import_prefix([1, 2, 3])  # the same prompt again: its own block
    assert first != second and manager.num_free_blocks == 6
    one, two = make_seq([1, 2, 3, 4]), make_seq([1, 2, 3, 5])
    assert manager.reuse_cached_prefix(one) == 3 and manager.reuse_cached_prefix(two) == 3
    assert {one.block_table[0], two.block_table[0]} == {first, second}
    assert manager.reuse_cached_prefix(make_seq([1, 2, 3, 6])) == 0  # none left
    _, (third,) = manager.import_prefix([1, 2, 3])
    assert manager.num_free_blocks == 5
    manager.drop_partial(third)
    assert manager.num_free_blocks == 6  # the two taken ones are in use
    manager.free(one)
    manager.free(two)
    assert manager.num_free_blocks == 8
