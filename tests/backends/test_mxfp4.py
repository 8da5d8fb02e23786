"""GPT-OSS's MXFP4 expert weights (checkpoint `*_blocks` / `*_scales`) kept packed: the repacking
into GGML MXFP4 blocks is lossless, against a numpy dequantiser of the checkpoint layout written
from the OCP microscaling spec and against transformers' own MXFP4 dequantiser; the cpu kernel
reproduces those values bit for bit through an identity input on both instruction sets."""

from __future__ import annotations

import numpy as np
import pytest
from test_native_kernels import ISAS, requires_native

from fastdeploy.backends.cpu import native
from fastdeploy.formats.mxfp4 import mxfp4_experts_to_ggml, mxfp4_to_ggml

#: FP4 e2m1 values by code (sign bit 3, two exponent bits, one mantissa bit)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def reference_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[out, in] float32: element 2j of a group in the low nibble of byte j, 2j+1 in the high one,
    times 2^(scale - 127), computed in float64 (exact) and rounded once."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*scales.shape, 32)
    values = E2M1[codes] * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return values.reshape(scales.shape[0], -1).astype(np.float32)


def checkpoint_tensors(experts: int, out: int, depth: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (experts, out, depth // 32, 16), dtype=np.uint8)
    scales = rng.choice(np.array([0, 1, 2, *range(112, 132)], np.uint8), (experts, out, depth // 32))
    return blocks, scales


def test_repacked_blocks_dequantise_to_the_checkpoint_values():
    blocks, scales = checkpoint_tensors(1, 24, 96)
    tensor = mxfp4_to_ggml(blocks[0], scales[0])
    assert tensor.type_name == "MXFP4" and tensor.shape == (24, 96) and tensor.rows.shape == (24, 3 * 17)
    np.testing.assert_array_equal(tensor.dequantize(), reference_dequantize(blocks[0], scales[0]))


def test_transformers_dequantiser_agrees():
    torch = pytest.importorskip("torch")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = checkpoint_tensors(3, 16, 64, seed=1)
    scales = np.clip(scales, 112, 131).astype(np.uint8)  # the range its float32 ldexp keeps normal
    theirs = convert_moe_packed_tensors(
        torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
    )
    for expert, tensor in enumerate(mxfp4_experts_to_ggml(blocks, scales)):
        # transformers lays the experts out [in, out]
        np.testing.assert_array_equal(tensor.dequantize(), theirs[expert].numpy().T)


@requires_native
@pytest.mark.parametrize("isa", ISAS)
def test_kernel_reproduces_the_checkpoint_values_exactly(isa):
    blocks, scales = checkpoint_tensors(2, 40, 128, seed=2)
    for expert, tensor in enumerate(mxfp4_experts_to_ggml(blocks, scales)):
        packed = native.pack([tensor])
        assert packed.type_name == "MXFP4"
        out = native.matmul(np.eye(128, dtype=np.float32), packed, isa, threads=2)
        np.testing.assert_array_equal(out, reference_dequantize(blocks[expert], scales[expert]).T)


@pytest.mark.parametrize(
    ("blocks", "scales", "words"),
    [
        (np.zeros((4, 2, 16), np.int8), np.zeros((4, 2), np.uint8), "must be uint8"),
        (np.zeros((4, 2, 8), np.uint8), np.zeros((4, 2), np.uint8), r"\[out, in/32, 16\]"),
        (np.zeros((4, 2, 16), np.uint8), np.zeros((4, 3), np.uint8), r"\[out, in/32, 16\]"),
    ],
)
def test_malformed_tensors_are_refused_by_name(blocks, scales, words):
    with pytest.raises(ValueError, match=words):
        mxfp4_to_ggml(blocks, scales, "model.layers.0.mlp.experts.down_proj")
