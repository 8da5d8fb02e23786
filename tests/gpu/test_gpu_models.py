"""The engine on an NVIDIA GPU against transformers on the same GPU (issue 9's correctness bar).

Random-weight checkpoints of SmolLM2-135M's and Llama-3.2-1B's shapes are built with
transformers (tools/gpu_checkpoints.py) for Llama, Qwen3 and ERNIE-4.5 MoE. In float32 the
greedy tokens must equal transformers' over 32 new tokens; in bfloat16 the first 8 must, and the
first step's top log-probabilities must agree within bfloat16's precision; float16 is held to
the same bar.

Random weights give flat distributions, where two tokens can score within rounding of each other.
Where the engines' tokens first differ, transformers' own scores of both tokens at that step
must then be within the dtype's tolerance (a tie the dtype cannot break, reported in the
assertion message otherwise); past that point the two continuations are not comparable and the
comparison stops. Any other difference fails.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

DEVICE = os.environ.get("FD_GPU_TEST_DEVICE", "cuda")
SHAPES = os.environ.get("FD_GPU_TEST_SHAPES", "smollm2,1b").split(",")
ARCHS = ("llama", "qwen3", "ernie_moe")
PROMPTS = [[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100], [84, 104, 101, 32] * 5, [1, 2, 3]]


def _checkpoints():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "gpu_checkpoints.py")
    spec = importlib.util.spec_from_file_location("gpu_checkpoints", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_checkpoints", module)
    spec.loader.exec_module(module)
    if "tiny" in SHAPES:  # the CPU dry run of these tests
        module.SHAPES["tiny"] = dict(module.SHAPES["smollm2"], num_hidden_layers=2, vocab_size=300)
        module.MOE["tiny"] = module.MOE["smollm2"]
    return module


@pytest.fixture(scope="module", params=[(arch, shape) for shape in SHAPES for arch in ARCHS], ids=str)
def checkpoint(request, tmp_path_factory):
    arch, shape = request.param
    directory = str(tmp_path_factory.mktemp(f"{arch}-{shape}"))
    return _checkpoints().make_checkpoint(directory, arch, shape), arch


def _transformers(directory: str, dtype: str, prompts: list[list[int]], new_tokens: int):
    """Greedy tokens and each step's log-probabilities [new_tokens, vocab] from transformers on
    the same device."""
    import torch
    import transformers

    device = "cuda" if DEVICE == "cuda" else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).to(
        device
    )
    tokens, steps = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=device)
            out = model.generate(
                ids,
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
            tokens.append(out.sequences[0, len(prompt) :].tolist())
            logits = torch.stack([step[0] for step in out.logits]).float()
            steps.append(torch.log_softmax(logits, -1).cpu().numpy())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return tokens, steps


def _assert_greedy_agrees(ours: list[int], theirs: list[int], steps: np.ndarray, tolerance: float) -> None:
    """Identical tokens, or identical up to a step where transformers scores both within `tolerance`."""
    assert len(ours) == len(theirs)
    for step, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        if mine != reference:
            gap = float(steps[step][reference] - steps[step][mine])
            assert gap <= tolerance, (
                f"token {step}: ours {mine}, transformers {reference}, which transformers scores "
                f"{gap:.4g} higher in log-probability (tolerance {tolerance}); ours {ours}, theirs {theirs}"
            )
            return


def _ours(directory: str, dtype: str, prompts: list[list[int]], new_tokens: int):
    from fastdeploy import LLM, SamplingParams

    llm = LLM(
        model=directory,
        device=DEVICE,
        dtype=dtype,
        max_model_len=256,
        max_num_seqs=8,
        gpu_memory_utilization=0.3,
    )
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=5)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = [(list(o.outputs.token_ids), o.outputs.logprobs[0]) for o in outputs]
    del llm, outputs
    gc.collect()  # the next engine sizes its KV cache from free memory
    return result


def test_float32_greedy_tokens_equal_transformers(checkpoint):
    directory, _ = checkpoint
    expected, steps = _transformers(directory, "float32", PROMPTS, 32)
    ours = _ours(directory, "float32", PROMPTS, 32)
    for (tokens, _), theirs, scores in zip(ours, expected, steps, strict=True):
        _assert_greedy_agrees(tokens, theirs, scores, tolerance=1e-3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_first_tokens_and_logprobs_agree(checkpoint, dtype):
    directory, _ = checkpoint
    expected, steps = _transformers(directory, dtype, PROMPTS, 8)
    ours = _ours(directory, dtype, PROMPTS, 8)
    for (tokens, logprobs), theirs, scores in zip(ours, expected, steps, strict=True):
        _assert_greedy_agrees(tokens, theirs, scores, tolerance=0.1)
        reference = scores[0]
        for token, value in logprobs.items():
            # bfloat16 keeps 8 bits of mantissa (float16 11): a log-probability of a few units is
            # good to ~0.1
            assert value == pytest.approx(
                float(reference[token]), abs=0.1 + 0.02 * abs(float(reference[token]))
            )
