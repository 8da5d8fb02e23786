"""The decoding features (docs/decoding.md) with the model in rank processes (tensor parallelism).

Beam search copies KV blocks in every rank, prompt logprobs and speculative verification read
extra logits rows that the ranks send back: on the tiny Qwen3 over 2 ranks, each must give
transformers' answers (tests/fixtures/decoding_references.json, tiny_model_references.json),
as the one-process engine does (tests/engine).
"""

from __future__ import annotations

import pytest
import tiny_checkpoints as tiny
from decoding_cases import beam_params, load_references
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams

pytest.importorskip("paddle", reason="tensor parallelism on the CPU uses paddle.distributed (gloo)")

TOLERANCE = 1e-4
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
#: a prompt that repeats itself, so prompt lookup finds drafts
REPEATING = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]


@pytest.fixture(scope="module")
def qwen3_tp2(tiny_model_dirs):
    llm = LLM(
        model=tiny_model_dirs["qwen3"],
        tensor_parallel_size=2,
        max_model_len=64,
        max_num_seqs=8,
        block_size=4,
        num_gpu_blocks_override=96,
        speculative_config=NGRAM,
    )
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def references() -> dict:
    return load_references()["qwen3"]


def test_beams_over_two_ranks_match_transformers(qwen3_tp2, references):
    cases = references["beam_search"]
    params = [beam_params(case, [t for t in case["eos_token_ids"] if t != 2]) for case in cases]
    prompts = [{"prompt_token_ids": case["prompt_token_ids"]} for case in cases]
    outputs = qwen3_tp2.generate(prompts, params, use_tqdm=False)
    for output, case in zip(outputs, cases, strict=True):
        assert output.error_code == 200, output.error_msg
        expected = case["beams"]
        assert [sample.token_ids for sample in output.outputs] == [b["output_token_ids"] for b in expected]
        for sample, beam in zip(output.outputs, expected, strict=True):
            assert sample.cumulative_logprob == pytest.approx(beam["cumulative_logprob"], abs=TOLERANCE)
    manager = qwen3_tp2.llm_engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_prompt_logprobs_over_two_ranks_match_transformers(qwen3_tp2, references):
    cases = references["prompt_logprobs"]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
    outputs = qwen3_tp2.generate(
        [{"prompt_token_ids": case["prompt_token_ids"]} for case in cases], params, use_tqdm=False
    )
    for output, case in zip(outputs, cases, strict=True):
        assert output.error_code == 200, output.error_msg
        assert output.prompt_logprobs[0] is None
        for entry, expected in zip(output.prompt_logprobs[1:], case["positions"], strict=True):
            best = expected["top"][:2]
            assert set(entry) == {token for token, _ in best} | {expected["token"]}
            assert entry[expected["token"]] == pytest.approx(expected["logprob"], abs=TOLERANCE)


def test_prompt_lookup_over_two_ranks_keeps_transformers_greedy_tokens(qwen3_tp2, tiny_references):
    cases = tiny_references["qwen3"]["cases"]
    prompts = [case["prompt_token_ids"] for case in cases] + [REPEATING]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = qwen3_tp2.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert_tokens_match(
        [o.outputs.token_ids[: tiny.NEW_TOKENS] for o in outputs[: len(cases)]],
        [case["output_token_ids"] for case in cases],
    )
    drafted = sum(o.metrics.spec_num_draft_tokens for o in outputs)
    accepted = sum(o.metrics.spec_num_accepted_tokens for o in outputs)
    assert drafted > accepted > 0  # drafts were verified in the ranks, and rejected ones rolled back
