"""GGMLTensor's own Q8_0 / Q4_1 dequantisers against the `gguf` package's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from fastdeploy.formats import ggml_tensor
from fastdeploy.formats.ggml_tensor import GGMLTensor


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_1"])
def test_dequantisation_equals_gguf_bit_for_bit(type_name):
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((40, 256)).astype(np.float32)
    weights[1] = 0.0  # zero scale
    weights[2, :32] = 1e-7  # subnormal float16 scales
    weights[3, 32:64] = -60000.0  # near the float16 limit
    weights[4] *= 1e-3
    qtype = GGMLQuantizationType[type_name]
    blocks = quantize(weights, qtype)
    blocks[5, :2] = np.frombuffer(np.float16(-0.0).tobytes(), np.uint8)  # a negative-zero scale
    ours = GGMLTensor(int(qtype), blocks, weights.shape).dequantize()
    reference = dequantize(blocks, qtype).reshape(weights.shape)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours.view(np.uint32), reference.view(np.uint32))


@pytest.mark.parametrize("chunk", [1 << 16, 5])
def test_q6_k_dequantisation_equals_gguf_bit_for_bit(chunk, monkeypatch):
    """Random super-blocks (every 6-bit integer and int8 scale occurs) with float16 factors of both
    signs, zero, negative zero, subnormal and near the float16 limit; in one chunk and in several."""
    monkeypatch.setattr(ggml_tensor, "_Q6_K_CHUNK", chunk)
    rng = np.random.default_rng(1)
    rows, width = 24, 512
    blocks = rng.integers(0, 256, (rows * width // 256, 210), dtype=np.uint8)
    factors = (rng.choice([-1.0, 1.0], len(blocks)) * 2.0 ** rng.uniform(-14, -4, len(blocks))).astype(
        np.float16
    )
    factors[:4] = [0.0, -0.0, 6e-8, 60000.0]
    blocks[:, 208:210] = factors.view(np.uint8).reshape(-1, 2)
    qtype = GGMLQuantizationType.Q6_K
    ours = GGMLTensor(int(qtype), blocks.reshape(rows, -1), (rows, width)).dequantize()
    reference = dequantize(blocks.reshape(rows, -1), qtype).reshape(rows, width)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours.view(np.uint32), reference.view(np.uint32))
