"""GGMLTensor's own Q8_0 / Q4_1 dequantisers against the `gguf` package's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

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
