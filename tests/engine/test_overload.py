"""Overload without loss: requests whose KV need is four times the cache all finish, through
preemption and recomputation, with the greedy tokens each gets when it runs alone."""

from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams

BLOCK_SIZE = 16
NEW_TOKENS = 38
TOPICS = ["the sea", "a cat", "Paris", "music", "bread", "winter", "trains", "the moon"]
PROMPTS = [f"Fact {i}: {TOPICS[i % 8]} is" for i in range(64)]
PARAMS = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
ENGINE = {"max_model_len": 256, "max_num_seqs": 32, "block_size": BLOCK_SIZE}


@pytest.fixture(scope="module")
def roomy() -> LLM:
    """The same engine settings with a cache no request has to wait for."""
    return LLM(num_gpu_blocks_override=256, **ENGINE)


def test_64_requests_needing_4x_the_cache_finish_with_their_solo_tokens(roomy):
    tokenizer = roomy.get_tokenizer()
    blocks_each = [-(-(len(tokenizer.encode(p)) + NEW_TOKENS) // BLOCK_SIZE) for p in PROMPTS]
    cache_blocks = sum(blocks_each) // 4
    overloaded = LLM(num_gpu_blocks_override=cache_blocks, **ENGINE)
    assert overloaded.llm_engine.block_manager.num_blocks == cache_blocks

    outputs = overloaded.generate(PROMPTS, PARAMS, use_tqdm=False)

    assert overloaded.llm_engine.scheduler.num_preemptions > 0
    assert all(o.error_code == 200 and len(o.outputs.token_ids) == NEW_TOKENS for o in outputs)
    expected = roomy.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert roomy.llm_engine.scheduler.num_preemptions == 0
    assert [o.outputs.token_ids for o in outputs] == [o.outputs.token_ids for o in expected]
    # and a batch gives each request the tokens it gets alone (the kernels are batch-invariant)
    for index in (0, 21, 42, 63):
        (alone,) = roomy.generate([PROMPTS[index]], PARAMS, use_tqdm=False)
        assert alone.outputs.token_ids == outputs[index].outputs.token_ids
    blocks = overloaded.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks
