"""DeepSeek-V3 split over 2 tensor-parallel ranks: each rank holds half the query heads (and their
rows of kv_b_proj, columns of o_proj), the whole latent projection and cache, half the routed
experts and half the dense and shared MLPs' features; greedy tokens equal transformers' float32
ones, as in one process (tests/models/test_deepseek_v3.py)."""

from __future__ import annotations

import pytest
import tiny_deepseek as deepseek

from fastdeploy import LLM, SamplingParams

pytest.importorskip("paddle", reason="tensor parallelism on the CPU uses paddle.distributed (gloo)")
pytest.importorskip("transformers", reason="the reference tokens come from transformers")


def test_deepseek_v3_over_two_ranks_matches_transformers(tmp_path):
    deepseek.write_checkpoint(tmp_path / "hf", "v3", mtp=False)
    expected = deepseek.transformers_greedy(tmp_path / "hf", deepseek.PROMPTS)
    deepseek.write_checkpoint(tmp_path / "fd", "v3")
    llm = LLM(
        model=str(tmp_path / "fd"),
        tensor_parallel_size=2,
        max_model_len=deepseek.MAX_MODEL_LEN,
        max_num_seqs=4,
        block_size=16,
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=deepseek.NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in deepseek.PROMPTS], params, use_tqdm=False)
        assert [o.outputs.token_ids for o in outputs] == expected
    finally:
        llm.shutdown()
