"""SmolLM2 (Llama architecture, GGUF Q4_1/Q8_0) against transformers' float32 implementation.

The reference tokens and logits come from tools/make_reference.py (transformers + torch) and
are committed in tests/fixtures; this test needs neither. The shared `llm` runs the cpu backend's
default kernels (native, on the GGUF blocks); the AVX2 kernels and the numpy path (weights
dequantised to float32) must match the same reference.
"""

import pytest
from token_match import assert_outputs_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.cpu import native


def _cases(reference, kind):
    return [case for case in reference["cases"] if case["kind"] == kind]


def _run(llm, case):
    params = SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"]), logprobs=10)
    if case["kind"] == "chat":
        return llm.chat(case["input"], params, use_tqdm=False)[0]
    return llm.generate(case["input"], params, use_tqdm=False)[0]


def test_every_reference_case_is_checked(smollm2_reference):
    assert len(_cases(smollm2_reference, "text")) >= 5 and len(_cases(smollm2_reference, "chat")) >= 2


def _assert_tokens_match(output, case):
    assert_outputs_match([output], [case["output_token_ids"]], [case["name"]])
    assert output.prompt_token_ids == case["prompt_token_ids"]
    assert output.outputs.text == case["output_text"]


@pytest.fixture(scope="module", params=["avx2", "numpy"])
def llm_with_kernels(request):
    if request.param == "avx2" and native.unavailable_reason() is not None:
        pytest.skip(f"native kernels: {native.unavailable_reason()}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FD_CPU_KERNELS", request.param)
        return LLM(max_model_len=512, max_num_seqs=8)


@pytest.mark.parametrize("index", [0, 2, 6, 7])
def test_other_cpu_kernels_match_transformers(llm_with_kernels, smollm2_reference, index):
    case = smollm2_reference["cases"][index]
    _assert_tokens_match(_run(llm_with_kernels, case), case)


@pytest.mark.parametrize("index", range(8))
def test_greedy_tokens_and_logits_match_transformers(llm, smollm2_reference, index):
    case = smollm2_reference["cases"][index]
    output = _run(llm, case)
    _assert_tokens_match(output, case)
    # first step: differences between the top-10 logits equal differences of our log-probs
    top = case["first_step"]["top10"]
    first = output.outputs.logprobs[0]
    best_token, best_logit = top[0]
    assert first[best_token] == pytest.approx(case["first_step"]["chosen_logprob"], abs=2e-3)
    for token, logit in top[1:]:
        assert first[token] - first[best_token] == pytest.approx(logit - best_logit, abs=2e-3)


def test_chat_answers_the_capital_of_france(llm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    (output,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    assert output.outputs.text == "The capital of France is Paris."
    assert output.outputs.finish_reason == "stop"
