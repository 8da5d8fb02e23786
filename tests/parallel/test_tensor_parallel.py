"""Tensor and pipeline parallelism in rank processes: greedy tokens equal transformers' (= TP=1).

The tiny models (4 query heads, 2 KV heads; the MoE one with 8 experts and 2 shared experts)
run split over 2 and 4 ranks (4 replicates each KV head on two ranks), over 2 pipeline stages,
and over 2 x 2; SmolLM2 (9 query heads, 3 KV heads, GGUF Q4_1/Q8_0) over 3 ranks. The
references are transformers' float32 greedy tokens (tests/fixtures), which the one-process
engine also matches (tests/models). Ranks run paddle.distributed over gloo, so these tests need
paddlepaddle (a test extra).
"""

from __future__ import annotations

import re

import pytest
from token_match import assert_tokens_match

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams

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
        assert_tokens_match(generate_references(llm, tiny_references[name]), expected)
    finally:
        llm.shutdown()


def test_smollm2_over_three_ranks_matches_transformers(smollm2_reference, llm):
    """9 query heads and 3 KV heads over 3 ranks; GGUF Q4_1 blocks cut along both axes. A guided
    request (its mask applied to the logits the ranks send) answers as the one-process `llm` does."""
    split = LLM(max_model_len=512, max_num_seqs=4, tensor_parallel_size=3)
    try:
        for case in (smollm2_reference["cases"][0], smollm2_reference["cases"][6]):
            params = SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"]))
            run = split.chat if case["kind"] == "chat" else split.generate
            output = run(case["input"], params, use_tqdm=False)[0]
            assert output.outputs.token_ids == case["output_token_ids"]
            assert output.outputs.text == case["output_text"]
        phone = r"\(\d{3}\) \d{3}-\d{4}"
        guided = SamplingParams(
            temperature=0, max_tokens=16, guided_decoding=GuidedDecodingParams(regex=phone)
        )
        prompt = "Call our office at"
        answer = split.generate(prompt, guided, use_tqdm=False)[0].outputs.text
        assert re.fullmatch(phone, answer)
        assert answer == llm.generate(prompt, guided, use_tqdm=False)[0].outputs.text
    finally:
        split.shutdown()


@pytest.fixture(scope="module")
def pipeline_llm(tiny_model_dirs):
    """The tiny Llama over 2 pipeline stages of 1 rank each."""
    llm = tiny_llm(tiny_model_dirs["llama"], 1, 2)
    yield llm
    llm.shutdown()


@pytest.fixture()
def one_prompt_per_micro_batch(pipeline_llm, tiny_references):
    """A token budget of the shorter prompt: the first micro-batch holds that prompt alone."""
    scheduler = pipeline_llm.llm_engine.scheduler
    budget = scheduler.max_num_batched_tokens
    scheduler.max_num_batched_tokens = min(
        len(c["prompt_token_ids"]) for c in tiny_references["llama"]["cases"]
    )
    yield
    scheduler.max_num_batched_tokens = budget


def test_pipeline_stages_match_transformers(pipeline_llm, tiny_references):
    reference = tiny_references["llama"]
    expected = [c["output_token_ids"] for c in reference["cases"]]
    assert_tokens_match(generate_references(pipeline_llm, reference), expected)


def test_pipeline_keeps_one_micro_batch_per_stage_in_flight(
    pipeline_llm, tiny_references, one_prompt_per_micro_batch, monkeypatch
):
    """With 2 stages, a second micro-batch is sent before the first one's logits are awaited."""
    executor = pipeline_llm.llm_engine.executor
    in_flight = []
    submit = executor.submit

    def recording_submit(batch):
        submit(batch)
        in_flight.append(executor.num_in_flight)

    monkeypatch.setattr(executor, "submit", recording_submit)
    reference = tiny_references["llama"]
    expected = [c["output_token_ids"] for c in reference["cases"]]
    assert_tokens_match(generate_references(pipeline_llm, reference), expected)
    assert max(in_flight) == 2


def test_a_request_aborted_while_its_micro_batch_is_in_flight(pipeline_llm, tiny_references):
    """The other request of that micro-batch carries on; the aborted one's logits row is dropped."""
    engine = pipeline_llm.llm_engine
    first, second = tiny_references["llama"]["cases"]
    params = SamplingParams(temperature=0, max_tokens=len(first["output_token_ids"]), ignore_eos=True)
    engine.add_request("kept", first["prompt_token_ids"], params)
    engine.add_request("aborted", second["prompt_token_ids"], params)
    outputs = []
    while not (engine.executor.num_in_flight and engine.requests["aborted"].seqs[0].num_output_tokens):
        outputs += engine.step()
    # both prompts are done and a micro-batch with both sequences' next tokens is in flight
    in_flight = engine.scheduler.in_flight
    assert all(seq in in_flight for name in ("kept", "aborted") for seq in engine.requests[name].seqs)
    engine.abort_request("aborted")
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [(o.request_id, o.error_code, o.outputs.token_ids) for o in outputs] == [
        ("kept", 200, first["output_token_ids"])
    ]
    assert engine.executor.num_in_flight == 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
