"""GLM-4.5 over 2 tensor-parallel ranks (each holds half the heads, half the routed experts and
half the dense and shared MLPs' features): greedy tokens equal transformers' float32 ones, as in
one process (tests/models/test_glm4_moe.py)."""

from __future__ import annotations

import pytest
import tiny_glm as glm

from fastdeploy import LLM, SamplingParams

pytest.importorskip("paddle", reason="tensor parallelism on the CPU uses paddle.distributed (gloo)")
pytest.importorskip("transformers", reason="the reference tokens come from transformers")


def test_glm4_moe_over_two_ranks_matches_transformers(tmp_path):
    expected = glm.transformers_greedy(glm.write_checkpoint(tmp_path / "hf", with_mtp=False))
    directory = glm.write_checkpoint(tmp_path / "fd", with_mtp=True)
    llm = LLM(model=str(directory), tensor_parallel_size=2, max_model_len=128, max_num_seqs=4, block_size=16)
    try:
        params = SamplingParams(temperature=0, max_tokens=glm.NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in glm.PROMPTS], params, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    finally:
        llm.shutdown()
