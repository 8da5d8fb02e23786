"""ERNIE-4.5-VL on an NVIDIA GPU: the tiny random-weight model (tests/models/tiny_vl_checkpoint.py)
against transformers' outputs for text-only, one-image, two-image and video prompts
(tests/fixtures/ernie4_5_vl_references.json, made by tools/make_vl_references.py).

The vision tower runs on the device through the cuda backend's vision ops. float32 greedy tokens
must equal transformers' over 24 tokens and bfloat16's first 8 must; where they first differ,
transformers' own scores of both tokens must be within the dtype's tolerance (a tie the dtype
cannot break), as in test_gpu_models.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
pytest.importorskip("PIL", reason="the image cases need Pillow")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import tiny_checkpoints  # noqa: E402
import tiny_vl_checkpoint as tiny  # noqa: E402

DEVICE = os.environ.get("FD_GPU_TEST_DEVICE", "cuda")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("ernie-vl")
    tiny.write_checkpoint(directory, "pt")
    tiny_checkpoints.write_ernie_tokenizer(directory)
    return str(directory)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


@pytest.mark.parametrize(("dtype", "tokens", "tolerance"), [("float32", 24, 1e-3), ("bfloat16", 8, 0.1)])
def test_greedy_tokens_equal_transformers(checkpoint, dtype, tokens, tolerance):
    from fastdeploy import LLM, SamplingParams

    llm = LLM(
        model=checkpoint,
        device=DEVICE,
        dtype=dtype,
        max_model_len=256,
        gpu_memory_utilization=0.2,
        mm_processor_kwargs=tiny.VIDEO_KWARGS,
    )
    cases = tiny.load_references()["cases"]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    outputs = llm.generate([tiny.case_prompt(case) for case in cases], params, use_tqdm=False)
    for output, case in zip(outputs, cases, strict=True):
        assert output.error_code == 200, output.error_msg
        assert output.prompt_token_ids == case["expanded_token_ids"]
        ours, theirs = output.outputs.token_ids, case["output_token_ids"][:tokens]
        for step, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
            if mine != reference:
                scores = _log_softmax(np.asarray(case["step_logits"][step], dtype=np.float64))
                gap = scores[reference] - scores[mine]
                assert gap <= tolerance, f"{case['name']}, token {step}: ours {ours}, transformers {theirs}"
                break
