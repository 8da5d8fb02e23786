"""Guided decoding when the model runs in rank processes (tensor and pipeline parallelism): the
ranks send host logits, which the engine masks itself; a tiny random Llama (160 tokens: its
tokenizer's byte tokens spell the pattern) must still follow the constraint, and its unconstrained neighbour must get the tokens it gets alone."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))

import tiny_checkpoints as tiny  # noqa: E402

PATTERN = "[a-e]{3}-[0-9]{2}"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("llama")
    tiny.write_checkpoint(directory, "llama", "pt")
    tiny.write_ernie_tokenizer(directory)
    return str(directory)


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_constrained_and_plain_requests_in_rank_processes(tiny_llama, tp, pp):
    plain = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    guided = SamplingParams(
        temperature=0.9, seed=3, max_tokens=16, guided_decoding=GuidedDecodingParams(regex=PATTERN)
    )
    prompts = [{"prompt_token_ids": [5, 17, 33, 90]}, {"prompt_token_ids": [7, 64, 101, 12, 3]}]
    llm = LLM(model=tiny_llama, tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=64)
    try:
        (alone,) = llm.generate(prompts[:1], plain, use_tqdm=False)
        mixed = llm.generate(prompts, [plain, guided], use_tqdm=False)
    finally:
        llm.shutdown()
    assert [output.error_code for output in mixed] == [200, 200], [output.error_msg for output in mixed]
    assert mixed[0].outputs.token_ids == alone.outputs.token_ids
    assert re.fullmatch(PATTERN, mixed[1].outputs.text), mixed[1].outputs.text
