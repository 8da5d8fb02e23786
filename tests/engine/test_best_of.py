"""`best_of`: draw best_of samples, return the n with the highest cumulative logprob."""

from __future__ import annotations

import pytest
import tiny_checkpoints as tiny

from fastdeploy import LLM, SamplingParams

PROMPT = {"prompt_token_ids": [1, 17, 42, 99, 5, 63, 120]}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> LLM:
    directory = tmp_path_factory.mktemp("qwen3")
    tiny.write_checkpoint(directory, "qwen3", "pt")
    tiny.write_ernie_tokenizer(directory)
    return LLM(model=str(directory), max_model_len=64, block_size=4, num_gpu_blocks_override=128)


def rescored(llm: LLM, token_ids: list[int]) -> float:
    """The sum of the output tokens' logprobs, re-scored as prompt logprobs of prompt + output."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    (output,) = llm.generate(
        {"prompt_token_ids": PROMPT["prompt_token_ids"] + token_ids}, params, use_tqdm=False
    )
    start = len(PROMPT["prompt_token_ids"])
    return sum(entry[token] for entry, token in zip(output.prompt_logprobs[start:], token_ids, strict=True))


def test_the_n_most_likely_of_best_of_samples_are_returned_best_first(qwen3):
    settings = {"temperature": 1.0, "seed": 7, "max_tokens": 6, "ignore_eos": True}
    (best,) = qwen3.generate(PROMPT, SamplingParams(n=2, best_of=5, **settings), use_tqdm=False)
    # the same five seeded samples, all returned (sample i is seeded with (seed, i) either way)
    (every,) = qwen3.generate(PROMPT, SamplingParams(n=5, logprobs=0, **settings), use_tqdm=False)
    scores = {tuple(s.token_ids): rescored(qwen3, s.token_ids) for s in every.outputs}
    assert len(scores) > 2, "the samples should differ"
    ranked = sorted(scores, key=lambda tokens: -scores[tokens])
    assert [tuple(sample.token_ids) for sample in best.outputs] == ranked[:2]
    assert [sample.index for sample in best.outputs] == [0, 1]
    for sample in best.outputs:
        assert sample.cumulative_logprob == pytest.approx(scores[tuple(sample.token_ids)], abs=1e-4)
    (again,) = qwen3.generate(PROMPT, SamplingParams(n=2, best_of=5, **settings), use_tqdm=False)
    assert [s.token_ids for s in again.outputs] == [s.token_ids for s in best.outputs]


def test_best_of_equal_to_n_returns_every_sample(qwen3):
    params = SamplingParams(n=3, best_of=3, temperature=1.0, seed=1, max_tokens=4, ignore_eos=True)
    (output,) = qwen3.generate(PROMPT, params, use_tqdm=False)
    plain = qwen3.generate(
        PROMPT, SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    assert [s.token_ids for s in output.outputs] == [s.token_ids for s in plain[0].outputs]


def test_best_of_samples_carry_the_text_of_their_tokens(qwen3):
    """best_of samples are not streamed, so they detokenize once, at the end (defer_text)."""
    params = SamplingParams(n=2, best_of=4, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True)
    (output,) = qwen3.generate(PROMPT, params, use_tqdm=False)
    tokenizer = qwen3.get_tokenizer()
    assert [sample.text for sample in output.outputs] == [
        tokenizer.decode(sample.token_ids) for sample in output.outputs
    ]
