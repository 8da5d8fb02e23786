"""Prefix caching: block reuse, exact keys, eviction order, and identical outputs through LLM."""

import numpy as np
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.block_manager import BlockManager
from fastdeploy.engine.sequence import Sequence


def make_seq(tokens) -> Sequence:
    return Sequence(0, "r", 0, list(tokens), SamplingParams(), 100, np.random.default_rng(0), 0.0)


def admit_and_compute(manager: BlockManager, seq: Sequence) -> int:
    """What the scheduler and engine do: reuse a prefix, allocate the rest, compute, register."""
    cached = manager.reuse_cached_prefix(seq)
    remaining = seq.num_tokens - seq.num_computed_tokens
    manager.allocate(seq, remaining)
    seq.num_computed_tokens += remaining
    manager.register_full_blocks(seq)
    return cached


def test_full_blocks_of_a_shared_prefix_are_reused():
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = make_seq(range(10))
    assert admit_and_compute(manager, first) == 0
    second = make_seq([*range(9), 99, 98])
    assert admit_and_compute(manager, second) == 8
    assert second.block_table[:2] == first.block_table[:2]
    third = make_seq([0, 1, 2, 3, 7, 7, 7, 7, 7])
    assert admit_and_compute(manager, third) == 4
    assert third.block_table[0] == first.block_table[0] and third.block_table[1] != first.block_table[1]


def test_the_last_token_is_always_computed():
    manager = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    admit_and_compute(manager, make_seq(range(8)))
    again = make_seq(range(8))
    assert manager.reuse_cached_prefix(again) == 4  # not 8: the pass needs a token to sample from


def test_freed_cached_blocks_are_evicted_last_and_never_hit_stale():
    manager = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    owner = make_seq([1, 2, 3, 4, 5])
    admit_and_compute(manager, owner)  # 3 blocks, [1,2] and [3,4] registered
    manager.free(owner)
    assert manager.num_free_blocks == 4
    cached_blocks = set(owner.block_table[:2])
    filler = make_seq([9, 9])
    manager.allocate(filler, 2)
    assert filler.block_table[0] not in cached_blocks  # never-cached blocks go first
    probe = make_seq([1, 2, 3, 4, 0])
    assert manager.reuse_cached_prefix(probe) == 4
    manager.free(probe)
    hog = make_seq([7] * 6)
    manager.allocate(hog, 6)  # needs 3 blocks: the last free one and both cached ones
    assert manager.num_free_blocks == 0 and cached_blocks <= set(hog.block_table)
    manager.free(hog)
    manager.free(filler)
    assert manager.reuse_cached_prefix(make_seq([1, 2, 3, 4, 0])) == 0


def test_reused_parent_block_does_not_resurrect_its_old_children():
    manager = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    original = make_seq([1, 2, 3, 4, 0])
    admit_and_compute(manager, original)
    duplicate = make_seq([1, 2, 5, 6, 0])  # its first block is a cache hit, its second is new
    admit_and_compute(manager, duplicate)
    manager.free(original)
    manager.free(duplicate)
    # exhaust and release every block: every block id is handed out afresh
    hog = make_seq(list(range(100, 112)))
    manager.allocate(hog, 12)
    manager.free(hog)
    assert manager.reuse_cached_prefix(make_seq([1, 2, 3, 4, 0])) == 0


def test_cached_prefix_gives_identical_outputs_and_reports_cached_tokens(llm):
    system = {"role": "system", "content": "You are a meticulous assistant. " * 12}
    chats = [
        [system, {"role": "user", "content": "What is the capital of France?"}],
        [system, {"role": "user", "content": "Name a large ocean."}],
    ]
    params = SamplingParams(temperature=0, max_tokens=12)
    expected = [o.outputs.token_ids for o in llm.chat(chats, params, use_tqdm=False)]
    cached_llm = LLM(max_model_len=1024, block_size=16)  # prefix caching is on by default
    first = cached_llm.chat(chats[0], params, use_tqdm=False)[0]
    second = cached_llm.chat(chats[1], params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    common = 0
    for a, b in zip(first.prompt_token_ids, second.prompt_token_ids, strict=False):
        if a != b:
            break
        common += 1
    assert common > 80  # the shared system prompt spans several blocks
    assert second.num_cached_tokens == common // 16 * 16
    assert_tokens_match([first.outputs.token_ids, second.outputs.token_ids], expected)
    repeat = cached_llm.chat(chats[0], params, use_tqdm=False)[0]
    assert repeat.outputs.token_ids == expected[0]
    assert repeat.num_cached_tokens == (len(first.prompt_token_ids) - 1) // 16 * 16
    stats = cached_llm.llm_engine.scheduler.prefix_cache_stats
    prompts = [first, second, repeat]
    assert stats.queried_tokens == sum(len(o.prompt_token_ids) for o in prompts)
    assert stats.hit_tokens == second.num_cached_tokens + repeat.num_cached_tokens
    assert (stats.queried_requests, stats.hit_requests) == (3, 2)
    assert stats.hit_token_rate == stats.hit_tokens / stats.queried_tokens
    assert stats.hit_request_rate == 2 / 3


def test_prefix_cache_totals_reach_the_metrics():
    """The server's gauges and counter from the engine thread's step totals (hand-computed)."""
    from fastdeploy.engine.async_engine import StepStats
    from fastdeploy.engine.prefix_cache_stats import PrefixCacheStats
    from fastdeploy.entrypoints.openai.metrics import ServerMetrics

    metrics = ServerMetrics()
    stats = PrefixCacheStats()
    for prompt, cached in [(100, 0), (120, 64), (90, 80)]:
        stats.record(prompt, cached)
    step = StepStats(0, 0, 0.0, 10, 10, prefix_cache=stats)
    metrics.observe_step(step)
    metrics.observe_step(step)  # the same totals again: nothing more is counted
    text = metrics.render().decode()
    assert "fastdeploy:hit_token_rate 0.4645161290322581" in text  # 144 / 310
    assert "fastdeploy:hit_req_rate 0.6666666666666666" in text
    assert "fastdeploy:prefix_cache_token_num_total 144.0" in text
