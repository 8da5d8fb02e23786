"""Tensor and pipeline parallelism in rank processes: greedy tokens equal transformers' (= TP=1).

The tiny models (4 query heads, 2 KV heads; the MoE one with 8 experts and 2 shared experts)
run split over 2 and 4 ranks (4 replicates each KV head on two ranks), over 2 pipeline stages,
and over 2 x 2; SmolLM2 (9 query heads, 3 KV heads, GGUF Q4_1/Q8_0) over 3 ranks. The
references are transformers' float32 greedy tokens (tests/fixtures), which the one-process
engine also matches (tests/models). Ranks run paddle.distributed over gloo, so these tests need
paddlepaddle (a test extra).
"""

from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams

pytest.importorskip("paddle", reason="tensor parallelism on the CPU uses paddle.distributed (gloo)")


def generate_references(llm: LLM, reference: dict) -> list[list[int]]:
    params = SamplingParams(
        temperature=0, max_tokens=len(reference["cases"][0]["output_token_ids"]), ignore_eos=True
    )
    prompts = [{"prompt_token_ids": case["prompt_token_ids"]} for case in reference["cases"]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(output.error_code == 200 for output in outputs), [output.error_msg for output in outputs]
    return [output.outputs.token_ids for output in outputs]


def tiny_llm(path: str, tp: int, pp: int = 1) -> LLM:
    return LLM(
        model=path,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=64,
        max_num_seqs=4,
        block_size=16,
        num_gpu_blocks_override=16,
    )


@pytest.mark.parametrize(
    ("name", "tp", "pp", "communicator"),
    [
        ("llama", 2, 1, "paddle"),
        ("qwen3", 2, 1, "paddle"),
        ("ernie4_5", 2, 1, "paddle"),
        ("ernie4_5_moe", 2, 1, "paddle"),
        ("llama", 4, 1, "paddle"),
        ("llama", 1, 2, "paddle"),
        ("ernie4_5_moe", 2, 2, "paddle"),
        ("ernie4_5_moe", 2, 2, "torch"),
    ],
)
def test_greedy_tokens_match_transformers(
    tiny_model_dirs, tiny_references, monkeypatch, name, tp, pp, communicator
):
    if communicator == "torch":
        pytest.importorskip("torch.distributed", reason="the torch communicator needs torch")
    monkeypatch.setenv("FD_COMMUNICATOR", communicator)
    llm = tiny_llm(tiny_model_dirs[name], tp, pp)
    try:
        expected = [case["output_token_ids"] for case in tiny_references[name]["cases"]]
        assert generate_references(llm, tiny_references[name]) == expected
    finally:
        llm.shutdown()


def test_smollm2_over_three_ranks_matches_transformers(smollm2_reference):
    """9 query heads and 3 KV heads over 3 ranks; GGUF Q4_1 blocks cut along both axes."""
    llm = LLM(max_model_len=512, max_num_seqs=4, tensor_parallel_size=3)
    try:
        for case in (smollm2_reference["cases"][0], smollm2_reference["cases"][6]):
            params = SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"]))
            run = llm.chat if case["kind"] == "chat" else llm.generate
            output = run(case["input"], params, use_tqdm=False)[0]
            assert output.outputs.token_ids == case["output_token_ids"]
            assert output.outputs.text == case["output_text"]
    finally:
        llm.shutdown()


def test_pipeline_keeps_one_micro_batch_per_stage_in_flight(tiny_model_dirs, tiny_references, monkeypatch):
    """With 2 stages, a second micro-batch is sent before the first one's logits are awaited."""
    llm = tiny_llm(tiny_model_dirs["llama"], 1, 2)
    executor = llm.llm_engine.executor
    in_flight = []
    submit = executor.submit

    def recording_submit(batch):
        submit(batch)
        in_flight.append(executor.num_in_flight)

    monkeypatch.setattr(executor, "submit", recording_submit)
    try:
        reference = tiny_references["llama"]
        # a budget of the shorter prompt: the first micro-batch holds that prompt alone
        llm.llm_engine.scheduler.max_num_batched_tokens = min(
            len(c["prompt_token_ids"]) for c in reference["cases"]
        )
        expected = [case["output_token_ids"] for case in reference["cases"]]
        assert generate_references(llm, reference) == expected
    finally:
        llm.shutdown()
    assert max(in_flight) == 2
