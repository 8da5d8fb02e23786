"""The minimal model plugin of docs/plugins.md (plugins/fastdeploy-minimal-model), used as a user
would: pip-installed, found through its entry point, reached only through `LLM(model=...)`.

References: a float64 numpy forward pass (`numpy_reference.llama_logits`, which rotates the
first `partial_rotary_factor` of each head) and, with whole-head rotary, the built-in
`LlamaForCausalLM` on the same weights (the same graph, written independently).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.backends.conformance.numpy_reference import greedy_tokens, llama_logits

PROMPTS = [[72, 101, 108, 108, 111, 44, 32], [87, 111, 114, 108, 100]]
NEW_TOKENS = 10


def write_minimal_checkpoint(directory: str, **config_fields) -> tuple[dict, dict]:
    """tiny_llama's weights and byte tokenizer under the plugin's architecture name."""
    config, weights = tiny_llama(directory)
    config.update(architectures=["MinimalLMForCausalLM"], model_type="minimal_lm", **config_fields)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return config, weights


def generate(directory: str, device: str = "cpu") -> tuple[str, list]:
    """Greedy completions of PROMPTS as one batch, with the top-3 logprobs of each step."""
    llm = LLM(model=directory, device=device, max_model_len=64, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=3)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return llm.llm_engine.model_config.architecture, [o.outputs for o in outputs]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


@pytest.mark.parametrize("device", ["cpu", "paddle-cpu"])
def test_partial_rotary_model_matches_the_numpy_forward(tmp_path, example_plugins, device):
    if device == "paddle-cpu":
        pytest.importorskip(
            "paddle", reason="the Paddle backend needs paddlepaddle (the test extra installs it)"
        )
    config, weights = write_minimal_checkpoint(str(tmp_path), partial_rotary_factor=0.5)
    architecture, outputs = generate(str(tmp_path), device)
    assert architecture == "MinimalLMForCausalLM"
    expected = [greedy_tokens(lambda ids: llama_logits(weights, config, ids), p, NEW_TOKENS) for p in PROMPTS]
    assert_tokens_match([output.token_ids for output in outputs], expected)
    for prompt, output, tokens in zip(PROMPTS, outputs, expected, strict=True):
        reference = log_softmax(llama_logits(weights, config, prompt + tokens[:4])[-1])
        for token, logprob in output.logprobs[4].items():
            assert logprob == pytest.approx(reference[token], abs=1e-4)


def test_partial_rotary_changes_the_output(tmp_path, example_plugins):
    """The reference itself tells half rotary from whole-head rotary on these weights."""
    config, weights = write_minimal_checkpoint(str(tmp_path), partial_rotary_factor=0.5)
    whole = dict(config, partial_rotary_factor=1.0)
    half = greedy_tokens(lambda ids: llama_logits(weights, config, ids), PROMPTS[0], NEW_TOKENS)
    assert half != greedy_tokens(lambda ids: llama_logits(weights, whole, ids), PROMPTS[0], NEW_TOKENS)


def test_whole_head_rotary_matches_the_builtin_llama(tmp_path, example_plugins):
    plugin_dir, builtin_dir = str(tmp_path / "plugin"), str(tmp_path / "builtin")
    write_minimal_checkpoint(plugin_dir)
    tiny_llama(builtin_dir)
    plugin, builtin = generate(plugin_dir)[1], generate(builtin_dir)[1]
    assert [o.token_ids for o in plugin] == [o.token_ids for o in builtin]
