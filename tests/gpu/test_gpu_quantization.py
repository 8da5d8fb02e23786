"""Quantised weights on a GPU: the compiled `triton_quant` kernels against torch's matmul of the
dequantised weights, and a quantised model's greedy tokens against a float64 numpy forward pass
over the same dequantised weights (float32 activations, so the tokens must agree exactly).

`FD_GPU_TEST_DEVICE=torch-cpu` runs the model comparison on the host (Triton interpreted)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.formats.weight_only import quantize_weight_only

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("FD_GPU_TEST_DEVICE", "cuda")


def _fp8_missing(torch) -> bool:
    return DEVICE == "cuda" and torch.cuda.get_device_capability() < (8, 9)


@pytest.mark.parametrize("format_name", ["wint8", "wint4", "Q8_0", "Q4_0", "fp8"])
@pytest.mark.parametrize("rows", [1, 16, 300])
def test_compiled_kernels_match_torch(format_name, rows):
    import torch

    from fastdeploy.backends.cuda import triton_quant as quant

    if DEVICE != "cuda":
        pytest.skip("compiled kernels need the GPU (tests/backends/test_triton_quant.py interprets them)")
    if format_name == "fp8" and _fp8_missing(torch):
        pytest.skip("no FP8 tensor cores on this GPU")
    k, n = 1024, 768
    rng = np.random.default_rng(rows)
    matrix = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    if format_name in ("Q8_0", "Q4_0"):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize, quantize

        qtype = GGMLQuantizationType[format_name]
        blocks = quantize(matrix, qtype)
        dense, weight, scales, group = dequantize(blocks, qtype).reshape(n, k), blocks, None, 0
    else:
        packed = quantize_weight_only(matrix, format_name, 128)
        dense, weight, scales, group = packed.dequantize(), packed.qweight, packed.scales, packed.group_size
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config = quant.matmul_config(format_name, rows, n, k, sms, False, group)
    split = config["SPLIT_K"] > 1
    out = (
        torch.zeros(rows, n, device="cuda")
        if split
        else torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    )
    device_scales = None if scales is None else torch.from_numpy(scales).cuda()
    quant.quant_matmul(
        x, torch.from_numpy(weight).cuda(), device_scales, out, format_name, n, k, config, group
    )
    expected = x.double() @ torch.from_numpy(dense.T.copy()).cuda().double()
    torch.testing.assert_close(out.double(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("quantization", ["wint8", "wint4", "fp8"])
def test_quantised_model_generates_the_reference_tokens(tmp_path, quantization):
    import torch

    if quantization == "fp8" and _fp8_missing(torch):
        pytest.skip("no FP8 tensor cores on this GPU")
    config, weights = tiny_llama(str(tmp_path))
    seen = {}
    for name, value in weights.items():
        if name == "model.embed_tokens.weight":
            seen[name] = value if quantization == "fp8" else quantize_weight_only(value, "wint8").dequantize()
        elif name.endswith("_proj.weight"):
            seen[name] = quantize_weight_only(value, quantization, 64).dequantize()
        else:
            seen[name] = value
    llm = LLM(
        model=str(tmp_path),
        device=DEVICE,
        dtype="float32",
        quantization=quantization,
        quantization_group_size=64,
        max_model_len=64,
        block_size=16,
    )
    prompt = [72, 101, 108, 108, 111, 44, 32]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    (output,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    expected = ref.greedy_tokens(lambda ids: ref.llama_logits(seen, config, ids), prompt, 8)
    assert list(output.outputs[0].token_ids) == expected
