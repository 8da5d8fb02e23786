"""Prompt logprobs (`SamplingParams.prompt_logprobs`) against transformers' log-softmax.

References: tests/fixtures/decoding_references.json (tools/make_decoding_references.py), the
log-softmax of transformers' float32 logits at every prompt position, for the embedded SmolLM2
and the tiny ERNIE-4.5 / Qwen checkpoints.
"""

from __future__ import annotations

import pytest
import tiny_checkpoints as tiny
from decoding_cases import load_references

from fastdeploy import LLM, SamplingParams

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def references() -> dict:
    return load_references()


def assert_matches(prompt_logprobs, case, top: int) -> None:
    ids = case["prompt_token_ids"]
    assert len(prompt_logprobs) == len(ids)
    assert prompt_logprobs[0] is None
    for entry, expected in zip(prompt_logprobs[1:], case["positions"], strict=True):
        best = expected["top"][:top]
        # the `top` most likely tokens and the prompt's own token, nothing else
        assert set(entry) == {token for token, _ in best} | {expected["token"]}
        assert entry[expected["token"]] == pytest.approx(expected["logprob"], abs=TOLERANCE)
        for token, value in best:
            assert entry[token] == pytest.approx(value, abs=TOLERANCE)


def test_smollm2_prompt_logprobs_match_transformers(llm, references):
    for case in references["SmolLM2-135M-Instruct"]["prompt_logprobs"]:
        params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3)
        (output,) = llm.generate({"prompt_token_ids": case["prompt_token_ids"]}, params, use_tqdm=False)
        assert output.error_code == 200, output.error_msg
        assert_matches(output.prompt_logprobs, case, 3)


@pytest.mark.parametrize("name", sorted(tiny.SPECS))
def test_tiny_models_match_transformers_across_chunks_and_samples(tmp_path, references, name):
    """Chunked prefill (3-token chunks) and n=2 samples give the same, complete prompt logprobs."""
    tiny.write_checkpoint(tmp_path, name, "pt")
    tiny.write_ernie_tokenizer(tmp_path)
    llm = LLM(
        model=str(tmp_path),
        max_model_len=64,
        block_size=4,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=3,
    )
    cases = references[name]["prompt_logprobs"]
    params = SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=2, prompt_logprobs=5)
    outputs = llm.generate(
        [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
    )
    for output, case in zip(outputs, cases, strict=True):
        assert output.error_code == 200, output.error_msg
        assert_matches(output.prompt_logprobs, case, 5)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("qwen3")
    tiny.write_checkpoint(directory, "qwen3", "pt")
    tiny.write_ernie_tokenizer(directory)
    return str(directory)


def test_prompt_logprobs_bypass_the_prefix_cache(qwen3_dir, references):
    """A cached prompt has no logits: the request recomputes it, and later ones still hit the cache."""
    llm = LLM(
        model=qwen3_dir,
        max_model_len=64,
        block_size=4,
        num_gpu_blocks_override=64,
        enable_prefix_caching=True,
    )
    case = references["qwen3"]["prompt_logprobs"][1]
    prompt = {"prompt_token_ids": case["prompt_token_ids"]}
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
    (scored,) = llm.generate(prompt, params, use_tqdm=False)
    assert scored.num_cached_tokens == 0
    assert_matches(scored.prompt_logprobs, case, 2)
    (again,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    assert again.num_cached_tokens == 8 and again.prompt_logprobs is None


def test_preempted_requests_record_each_position_once(qwen3_dir, references):
    """Too few KV blocks for all prompts at once: requests are preempted and recomputed."""
    llm = LLM(model=qwen3_dir, max_model_len=32, block_size=4, num_gpu_blocks_override=8)
    cases = references["qwen3"]["prompt_logprobs"] * 3
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=1)
    outputs = llm.generate(
        [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
    )
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for output, case in zip(outputs, cases, strict=True):
        assert_matches(output.prompt_logprobs, case, 1)


def test_prompt_logprobs_above_max_logprobs_fail_alone(qwen3_dir):
    llm = LLM(model=qwen3_dir, max_model_len=32, block_size=4, num_gpu_blocks_override=16, max_logprobs=4)
    good = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=4)
    bad = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=5)
    outputs = llm.generate([{"prompt_token_ids": [1, 5, 9]}] * 2, [good, bad], use_tqdm=False)
    assert outputs[0].error_code == 200 and len(outputs[0].prompt_logprobs) == 3
    assert outputs[1].error_code == 400
    assert "prompt_logprobs must be in [0, 4] (the engine's max_logprobs), got 5" in outputs[1].error_msg
