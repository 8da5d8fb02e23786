"""gemm_w8a8.c: int8 weights with a scale per output channel (FastDeploy's wint8) times int8
activations with a scale per row and 128 inputs, against a numpy reference of those numerics.

The reference (numpy_reference.int8_activation_product) quantises each activation group as the
kernel promises (scale = max|x| / 127, q = round(x * 127 / max|x|) to nearest even, clipped to
+-127), takes exact integer dots with the weight's levels (FastDeploy's wint8 [in, out] layout,
not our packing) and combines them in float64. Both instruction sets must give the same bits:
AVX-512 VNNI and AVX2's maddubs.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.formats.weight_only import WeightOnlyTensor, quantize_weight_only
from fastdeploy.model_executor.quantization import quantize_tensors

pytestmark = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"native kernels: {native.unavailable_reason()}"
)
GROUP = 128


def runs_here(isa: str) -> bool:
    return native.ISAS.index(isa) >= native.ISAS.index(native.best_isa())


def w8a8_reference(x: np.ndarray, weight: WeightOnlyTensor, bias: np.ndarray | None) -> np.ndarray:
    """x [tokens, in] times a wint8 weight with int8-quantised activations, in float64."""
    out = ref.int8_activation_product(x, weight.qweight.T, weight.scales, GROUP)
    return out if bias is None else out + bias


@pytest.mark.parametrize("tokens", [1, 3, 4, 5, 9, 40])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a8_kernels_match_the_reference_and_each_other(tokens, with_bias):
    rng = np.random.default_rng(tokens)
    # 72 columns: 4.5 panels (a partial panel, and a column block of 2 after one of 3);
    # 288 inputs: groups of 128, 128 and 32
    weights = rng.standard_normal((72, 288)).astype(np.float32)
    wint8 = quantize_weight_only(weights, "wint8")
    x = rng.standard_normal((tokens, 288)).astype(np.float32)
    x[:, 7] *= 50  # an outlier channel, as residual streams have
    x[0, 128:256] = 0.0  # an all-zero group: scale 0
    bias = rng.standard_normal(72).astype(np.float32) if with_bias else None
    packed = native.pack([wint8], activations="int8")
    assert packed.type_name == "W8A8"
    expected = w8a8_reference(x, wint8, bias)
    outputs = [native.matmul(x, packed, isa, threads=2, bias=bias) for isa in native.ISAS if runs_here(isa)]
    for out in outputs:
        np.testing.assert_allclose(out, expected, rtol=2e-6, atol=2e-6 * np.abs(expected).max())
        np.testing.assert_array_equal(out, outputs[0])
    exact = x.astype(np.float64) @ weights.T.astype(np.float64) + (0 if bias is None else bias)
    error = np.abs(outputs[0] - exact).max() / np.abs(exact).max()
    assert 1e-4 < error < 5e-2  # int8 weights and activations are approximate, not broken


def test_fused_parts_keep_their_own_channel_scales():
    """A fused q/k/v of parts whose magnitudes differ 100x: each output channel keeps its scale."""
    rng = np.random.default_rng(5)
    parts = [rng.standard_normal((n, 64)).astype(np.float32) * size for n, size in ((40, 1.0), (8, 100.0))]
    x = rng.standard_normal((6, 64)).astype(np.float32)
    packed = native.pack([quantize_weight_only(part, "wint8") for part in parts], activations="int8")
    out = native.matmul(x, packed, native.best_isa(), 1)
    exact = x.astype(np.float64) @ np.concatenate(parts).T
    for columns in (slice(0, 40), slice(40, 48)):
        error = np.abs(out[:, columns] - exact[:, columns]).max() / np.abs(exact[:, columns]).max()
        assert error < 5e-2


def test_float_parts_are_quantised_per_channel_as_fastdeploy_does():
    """pack_w8a8 of float weights equals pack_w8a8 of FastDeploy's wint8 quantisation of them."""
    weights = np.random.default_rng(2).standard_normal((40, 96)).astype(np.float32)
    ours = native.pack_w8a8([weights])
    theirs = native.pack_w8a8([quantize_weight_only(weights, "wint8")])
    np.testing.assert_array_equal(ours.packed, theirs.packed)


def test_wint8_weights_stay_float32_under_float_activations():
    weights = np.random.default_rng(3).standard_normal((24, 64)).astype(np.float32)
    wint8 = quantize_weight_only(weights, "wint8")
    packed = native.pack([wint8], activations="float32")
    assert packed.type_name == "F32"
    eye = np.eye(64, dtype=np.float32)
    np.testing.assert_allclose(
        native.matmul(eye, packed, native.best_isa(), 1), wint8.dequantize().T, rtol=1e-6
    )


def test_wint8_with_int8_activations_quantises_per_channel(monkeypatch):
    """quantization="wint8" on the cpu backend: Q8_0 blocks, or with FD_CPU_ACTIVATIONS=int8 the
    per-channel levels gemm_w8a8.c multiplies."""
    weight = np.random.default_rng(4).standard_normal((32, 64)).astype(np.float32)
    tensors = [("model.layers.0.mlp.up_proj.weight", weight)]
    ((_, blocks),) = quantize_tensors(tensors, "wint8", False, "test", CpuBackend.weight_layout("wint8"))
    assert blocks.type_name == "Q8_0"
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", "int8")
    ((_, channels),) = quantize_tensors(tensors, "wint8", False, "test", CpuBackend.weight_layout("wint8"))
    assert isinstance(channels, WeightOnlyTensor) and channels.kind == "wint8"
    assert channels.scales.shape == (32,)
