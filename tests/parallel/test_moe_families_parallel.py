"""The sparse MoE families split over 2 tensor-parallel ranks: each rank holds half the routed
experts (and half of Qwen2-MoE's shared expert); greedy tokens equal transformers' float32 ones
(tests/fixtures/tiny_family_references.json), as in one process (tests/models/test_tiny_families.py)."""

from __future__ import annotations

import json

import pytest
import tiny_checkpoints as tiny
import tiny_families as families
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams

pytest.importorskip("paddle", reason="tensor parallelism on the CPU uses paddle.distributed (gloo)")


@pytest.mark.parametrize(
    ("name", "form"), [("qwen2_moe", "hf"), ("qwen3_moe_mixed", "hf"), ("mixtral", "gguf")]
)
def test_moe_families_over_two_ranks_match_transformers(tmp_path, name, form):
    reference = json.loads(families.REFERENCES.read_text(encoding="utf-8"))["models"][name]
    prompt_set = reference["prompt_sets"]["short"]
    directory = tmp_path / name
    tiny.write_ernie_tokenizer(directory)
    if form == "hf":
        families.write_checkpoint(directory, name)
        model = str(directory)
    else:
        model = str(families.gguf_path(name))
    llm = LLM(
        model=model,
        tokenizer=str(directory),
        tensor_parallel_size=2,
        max_model_len=prompt_set["max_model_len"],
        max_num_seqs=4,
        block_size=16,
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=families.NEW_TOKENS, ignore_eos=True)
        cases = prompt_set["cases"]
        outputs = llm.generate(
            [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
        )
        assert_tokens_match([o.outputs.token_ids for o in outputs], [c["output_token_ids"] for c in cases])
    finally:
        llm.shutdown()
