"""The Paddle backend on Paddle's CPU place ("paddle-cpu") runs SmolLM2 like the cpu backend.

This is the cuda backend's code (paddle tensors, paged KV cache, batch metadata, attention,
model weights) with the reference kernels; only the place differs. Its greedy tokens must equal
the numpy cpu backend's and transformers' (the committed reference fixture).
"""

from __future__ import annotations

import numpy as np
import pytest
from token_match import assert_tokens_match

from fastdeploy import SamplingParams

pytest.importorskip("paddle", reason="the Paddle backend needs paddlepaddle (the test extra installs it)")


@pytest.fixture(scope="module")
def paddle_llm():
    from fastdeploy import LLM

    return LLM(device="paddle-cpu", max_model_len=1024, max_num_seqs=8, cpu_threads=2)


#: tokens compared per case (the fixture has about 30; the first 16 keep the test short)
NEW_TOKENS = 16


def _run_all(llm, cases):
    """The cases' first NEW_TOKENS tokens, text prompts in one batch (prefill and decode share passes)."""
    texts = [case for case in cases if case["kind"] == "text"]
    chats = [case for case in cases if case["kind"] == "chat"]
    params = [SamplingParams(temperature=0, max_tokens=NEW_TOKENS, logprobs=5) for c in texts]
    outputs = dict(
        zip(
            [c["name"] for c in texts],
            llm.generate([c["input"] for c in texts], params, use_tqdm=False),
            strict=True,
        )
    )
    for case in chats:
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, logprobs=5)
        outputs[case["name"]] = llm.chat(case["input"], params, use_tqdm=False)[0]
    return outputs


def test_backend_is_the_paddle_one(paddle_llm):
    backend = paddle_llm.llm_engine.backend
    assert backend.name == "paddle-cpu" and backend.kernels == "reference"
    assert type(paddle_llm.llm_engine.runner.kv_caches[0][0]).__name__ == "Tensor"


def _some_cases(reference):
    """Three text prompts (run as one batch) and one chat conversation."""
    texts = [case for case in reference["cases"] if case["kind"] == "text"][:3]
    chats = [case for case in reference["cases"] if case["kind"] == "chat"][:1]
    return texts + chats


def test_greedy_tokens_equal_cpu_backend_and_transformers(paddle_llm, llm, smollm2_reference):
    cases = _some_cases(smollm2_reference)
    assert len(cases) == 4
    paddle_outputs = _run_all(paddle_llm, cases)
    cpu_outputs = _run_all(llm, cases)
    names = [case["name"] for case in cases]
    tokens = [paddle_outputs[name].outputs.token_ids for name in names]
    assert_tokens_match(tokens, [cpu_outputs[name].outputs.token_ids for name in names], names)
    assert_tokens_match(tokens, [case["output_token_ids"][:NEW_TOKENS] for case in cases], names)
    for case in cases:
        got = paddle_outputs[case["name"]].outputs
        # first-step log-probabilities of the top tokens agree with the cpu backend's
        cpu_first = cpu_outputs[case["name"]].outputs.logprobs[0]
        for token, value in got.logprobs[0].items():
            if token in cpu_first:
                assert value == pytest.approx(cpu_first[token], abs=1e-3)


def test_device_sampling_matches_its_definition(paddle_llm):
    from fastdeploy.backends.conformance import numpy_reference as ref

    backend = paddle_llm.llm_engine.backend
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((4, 49152)).astype(np.float32) * 4
    params = dict(
        temperatures=np.array([1.0, 0.6, 1.0, 0.8], np.float32),
        top_k=np.array([0, 40, 1, 0], np.int32),
        top_p=np.array([0.9, 1.0, 1.0, 0.5], np.float32),
        uniforms=rng.random(4).astype(np.float32),
    )
    tokens = backend.sample_top_k_top_p(backend.from_numpy(logits), **params)
    expected = [
        ref.sample_top_k_top_p(
            logits[i],
            float(params["temperatures"][i]),
            int(params["top_k"][i]),
            float(params["top_p"][i]),
            float(params["uniforms"][i]),
        )
        for i in range(4)
    ]
    assert tokens.tolist() == expected
    assert tokens[2] == int(np.argmax(logits[2]))


def test_seeded_sampling_runs_on_the_device_and_is_reproducible(paddle_llm):
    from fastdeploy import SamplingParams

    backend = paddle_llm.llm_engine.backend
    calls = []
    original = backend.sample_top_k_top_p

    def counting(*args):
        calls.append(len(args[4]))
        return original(*args)

    backend.sample_top_k_top_p = counting
    try:
        params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=5, max_tokens=6)
        first = paddle_llm.generate("Once upon a time", params, use_tqdm=False)[0].outputs.token_ids
        second = paddle_llm.generate("Once upon a time", params, use_tqdm=False)[0].outputs.token_ids
    finally:
        del backend.sample_top_k_top_p
    assert calls == [1] * 12  # every token of both runs was drawn by the device sampler
    assert first == second and len(first) == 6
