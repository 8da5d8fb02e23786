"""MXFP4 weights of GPT-OSS checkpoints, kept packed as GGML MXFP4 blocks.

GPT-OSS stores each expert projection as two tensors: `*_blocks`, uint8 [..., out, in / 32, 16]
(FP4 e2m1 values, two per byte: element 2j in the low nibble of byte j, 2j + 1 in the high one),
and `*_scales`, uint8 [..., out, in / 32] (an e8m0 exponent per 32 values: the value is
fp4 * 2^(scale - 127)). GGML's MXFP4 block holds the same numbers in 17 bytes: the exponent,
then 16 bytes with element i in the low nibble of byte i and element i + 16 in the high one (its
codebook doubles the FP4 values and its scale halves, so the products are the same and exact).
Moving the nibbles is lossless, so the weights stay 4.25 bits each: the cpu backend multiplies
the blocks with its MXFP4 kernel, other backends dequantise them (`GGMLTensor`).
"""

from __future__ import annotations

import numpy as np

from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.ggml_types import MXFP4

BLOCK = 32


def mxfp4_to_ggml(blocks: np.ndarray, scales: np.ndarray, name: str = "weight") -> GGMLTensor:
    """One [out, in] matrix from its checkpoint `blocks` [out, in/32, 16] and `scales` [out, in/32]."""
    blocks = np.asarray(blocks)
    scales = np.asarray(scales)
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(
            f"{name}: MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}"
        )
    if blocks.ndim != 3 or blocks.shape[2] != BLOCK // 2 or scales.shape != blocks.shape[:2]:
        raise ValueError(
            f"{name}: MXFP4 blocks must be [out, in/32, 16] with scales [out, in/32], "
            f"got {blocks.shape} and {scales.shape}"
        )
    out, groups = scales.shape
    nibbles = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(out, groups, BLOCK)
    packed = nibbles[..., : BLOCK // 2] | (nibbles[..., BLOCK // 2 :] << 4)
    rows = np.concatenate([scales[..., None], packed], axis=-1).reshape(out, groups * (BLOCK // 2 + 1))
    return GGMLTensor(MXFP4, np.ascontiguousarray(rows), (out, groups * BLOCK))


def mxfp4_experts_to_ggml(blocks: np.ndarray, scales: np.ndarray, name: str = "experts") -> list[GGMLTensor]:
    """Per expert, its [out, in] matrix from `blocks` [experts, out, in/32, 16] and `scales`."""
    if np.ndim(blocks) != 4:
        raise ValueError(
            f"{name}: MXFP4 expert blocks must be [experts, out, in/32, 16], got {np.shape(blocks)}"
        )
    return [mxfp4_to_ggml(blocks[e], scales[e], f"{name}[{e}]") for e in range(len(blocks))]
