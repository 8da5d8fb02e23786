"""The quantised matmul kernels (wint8, wint4, GGUF Q8_0 / Q4_0, block FP8), interpreted, against
float64 products over weights dequantised independently of the code under test: GGUF blocks by
the `gguf` package, FP8 bits by torch's float8_e4m3fn, the weight-only layouts by the formulas
their documentation states, written out here element by element."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize
from quant_reference import fp8_reference, wint4_reference, wint8_reference

from fastdeploy.formats.weight_only import quantize_fp8, quantize_wint4, quantize_wint8

torch = pytest.importorskip("torch", reason="Triton's interpreter needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")
from fastdeploy.backends.cuda import triton_quant as quant  # noqa: E402


def tensor(array: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(array))


def run(format_name, x, weight, scales, n, k, num_sms=4, group=0):
    config = quant.matmul_config(format_name, x.shape[0], n, k, num_sms, True, group)
    split = config["SPLIT_K"] > 1
    out = np.zeros((x.shape[0], n), np.float32) if split else np.full((x.shape[0], n), np.nan, np.float32)
    quant.quant_matmul(
        tensor(x),
        tensor(weight),
        None if scales is None else tensor(scales),
        tensor(out),
        format_name,
        n,
        k,
        config,
        group,
    )
    return out, config


def inputs(m, n, k, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), (rng.standard_normal((n, k)) * 0.1).astype(
        np.float32
    )


def check(out, x, weights):
    expected = x.astype(np.float64) @ weights.T
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_kernels_are_interpreted():
    assert type(quant._quant_matmul_kernel).__name__ == "InterpretedFunction"


@pytest.mark.parametrize(("m", "n", "k"), [(1, 40, 200), (5, 72, 96), (37, 130, 72)])
def test_wint8(m, n, k):
    x, w = inputs(m, n, k, m)
    packed = quantize_wint8(w)
    out, _ = run("wint8", x, packed.qweight, packed.scales, n, k)
    check(out, x, wint8_reference(packed.qweight, packed.scales))


@pytest.mark.parametrize(("m", "n", "k", "group"), [(3, 40, 256, 128), (16, 33, 192, 64), (37, 72, 128, 64)])
def test_wint4(m, n, k, group):
    x, w = inputs(m, n, k, k + m)
    packed = quantize_wint4(w, group)
    assert packed.qweight.shape == (k // 2, n) and packed.scales.shape == (k // group, n)
    out, _ = run("wint4", x, packed.qweight, packed.scales, n, k, group=group)
    check(out, x, wint4_reference(packed.qweight, packed.scales, group))


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize(("m", "n", "k"), [(2, 40, 96), (37, 24, 160)])
def test_gguf_blocks(type_name, m, n, k):
    x, w = inputs(m, n, k, n + k)
    qtype = GGMLQuantizationType[type_name]
    rows = quantize(w, qtype)
    out, _ = run(type_name, x, rows, None, n, k)
    check(out, x, dequantize(rows, qtype).reshape(n, k).astype(np.float64))


#: byte offsets of the float16 factors in a K-quant super-block (gguf's layouts)
K_QUANT_HALVES = {"Q4_K": (0, 2), "Q6_K": (208,)}


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize(("m", "n", "k"), [(3, 40, 256), (37, 24, 512)])
def test_gguf_k_quant_super_blocks(type_name, m, n, k):
    """Random block bytes (every scale, minimum and level pattern) with float16 factors of either
    sign, as gguf's dequantiser reads them."""
    qtype = GGMLQuantizationType[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(k + m)
    blocks = rng.integers(0, 256, (n * k // block_size, type_size), dtype=np.uint8)
    for offset in K_QUANT_HALVES[type_name]:
        halves = rng.choice([-1.0, 1.0], len(blocks)) * 2.0 ** rng.uniform(-10, -6, len(blocks))
        blocks[:, offset : offset + 2] = halves.astype(np.float16).view(np.uint8).reshape(-1, 2)
    rows = blocks.reshape(n, -1)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out, _ = run(type_name, x, rows, None, n, k)
    weights = dequantize(rows, qtype).reshape(n, k).astype(np.float64)
    np.testing.assert_allclose(
        out, x.astype(np.float64) @ weights.T, rtol=1e-4, atol=1e-4 * np.abs(weights).max()
    )


def test_fp8_blocks():
    x, w = inputs(3, 140, 200, 8)
    w[:, 150:] *= 40  # a second column of blocks on another scale
    packed = quantize_fp8(w)
    assert packed.scales.shape == (2, 2)
    try:
        out, _ = run("fp8", x, packed.qweight, packed.scales, 140, 200)
    except Exception as exc:  # the interpreter's float8 support depends on the triton version
        pytest.skip(f"Triton's interpreter cannot convert e4m3 here: {type(exc).__name__}: {exc}")
    check(out, x, fp8_reference(packed.qweight, packed.scales))


def test_decode_rows_split_k_and_add_into_float32():
    """A skinny launch over few output tiles splits K; the splits' partial sums add up."""
    x, w = inputs(4, 64, 1024, 11)
    packed = quantize_wint8(w)
    out, config = run("wint8", x, packed.qweight, packed.scales, 64, 1024, num_sms=16)
    assert config["BLOCK_M"] == 16 and config["SPLIT_K"] > 1
    check(out, x, wint8_reference(packed.qweight, packed.scales))


def test_prefill_rows_take_the_tiled_launch():
    assert quant.matmul_config("wint4", 300, 4096, 4096, 132, False, 128)["BLOCK_M"] == 128
    assert quant.matmul_config("wint4", 16, 4096, 4096, 132, False, 128)["BLOCK_M"] == 16


@pytest.mark.parametrize("group", [64, 128])
def test_wint4_quantiser_rounds_to_the_nearest_level(group):
    """Each weight is within half a step of its level; the step is max |w| / 7 of its group."""
    rng = np.random.default_rng(group)
    w = rng.standard_normal((24, 256)).astype(np.float32)
    w[:4] = 0  # an all-zero group has scale 0 and dequantises to 0
    packed = quantize_wint4(w, group)
    steps = np.abs(w).reshape(24, -1, group).max(axis=2) / 7
    np.testing.assert_allclose(packed.scales.T, steps, rtol=1e-6)
    error = np.abs(wint4_reference(packed.qweight, packed.scales, group) - w)
    assert (error <= np.repeat(steps, group, axis=1) / 2 + 1e-6).all()
    np.testing.assert_allclose(
        packed.dequantize(), wint4_reference(packed.qweight, packed.scales, group), rtol=1e-6
    )


def test_wint8_quantiser_rounds_to_the_nearest_level():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 100)).astype(np.float32)
    packed = quantize_wint8(w)
    steps = np.abs(w).max(axis=1) / 127
    error = np.abs(wint8_reference(packed.qweight, packed.scales) - w)
    assert (error <= steps[:, None] / 2 + 1e-6).all()


def test_quant_kernels_compile_for_sm80_and_sm90_without_a_gpu():
    """Each format at a decode and a prefill launch lowers to PTX and a cubin for real GPUs
    (bfloat16 activations), and so does the MoE GEMM over quantised experts; FP8 (matmul and
    experts) only for sm_90, the architectures before 8.9 have no e4m3."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "fastdeploy.backends.cuda.aot", "80", "90", "--dtypes", "bfloat16"]
    result = subprocess.run(
        [*command, "--group", "quant"], env=env, capture_output=True, text=True, timeout=1800
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    names = [line.split()[2] for line in lines]
    assert names.count("_quant_matmul_kernel") == 2 * 6 + 2 * 7, lines
    # the MoE GEMM over wint8 and wint4 experts, and FP8 ones on sm_90
    assert names.count("_gemm_kernel") == 2 * 2 + 1
    assert sum(line.startswith("sm_90") for line in lines) == 14 + 3
