"""Dequantisers for the weight-only layouts written from their documentation (docs/quantization.md),
element by element: the tests' references, independent of fastdeploy.formats.weight_only."""

from __future__ import annotations

import numpy as np


def wint8_reference(qweight: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """W[n, k] = q[k, n] * scale[n]."""
    return (qweight.astype(np.float64) * scales.astype(np.float64)[None, :]).T


def wint4_reference(packed: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    """W[n, k] = (nibble(k, n) - 8) * scale[k // group, n]; input k sits in byte k // 2 of its
    column, in the low nibble when k is even."""
    inp, out = packed.shape[0] * 2, packed.shape[1]
    weights = np.empty((out, inp))
    for k in range(inp):
        byte = packed[k // 2].astype(np.int64)
        level = (byte & 0x0F) if k % 2 == 0 else (byte >> 4)
        weights[:, k] = (level - 8) * scales[k // group].astype(np.float64)
    return weights


def fp8_reference(bits: np.ndarray, scales: np.ndarray) -> np.ndarray:
    import torch  # the FP8 reference reads the bits with torch's own float8_e4m3fn

    values = torch.from_numpy(np.ascontiguousarray(bits)).view(torch.float8_e4m3fn).to(torch.float64).numpy()
    expanded = np.kron(scales.astype(np.float64), np.ones((128, 128)))
    return values * expanded[: bits.shape[0], : bits.shape[1]]
