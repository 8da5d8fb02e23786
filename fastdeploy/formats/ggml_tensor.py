"""A GGUF-quantised matrix kept in its blocks until a backend decides how to use it.

Backends with kernels for the block format (the cpu backend's native Q4_1/Q8_0 products) take
the blocks as they are; everything else sees a float32 array through `__array__`, dequantised
with `gguf` exactly as before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np


def _dequantize_q8_0(rows: np.ndarray) -> np.ndarray:
    """d * q per 34-byte block (float16 d, 32 int8 q), as gguf computes it, in two numpy passes."""
    blocks = rows.reshape(-1, 34)
    scales = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    return (blocks[:, 2:].view(np.int8) * scales).reshape(rows.shape[0], -1)


def _dequantize_q4_1(rows: np.ndarray) -> np.ndarray:
    """d * q + m per 20-byte block (float16 d and m, 16 bytes of nibble pairs: q[i] | q[i+16] << 4)."""
    blocks = rows.reshape(-1, 20)
    scales = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    minimums = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    pairs = blocks[:, 4:]
    levels = np.concatenate([pairs & 0x0F, pairs >> 4], axis=1)
    return (levels * scales + minimums).reshape(rows.shape[0], -1)


#: why not gguf's dequantisers for these: they loop over small groups in Python (SmolLM2's Q8_0
#: embedding took ~0.4 s of CPU, a quarter of the start-up budget); tests check bit equality.
_FAST_DEQUANTIZERS = {"Q8_0": _dequantize_q8_0, "Q4_1": _dequantize_q4_1}


@dataclass(frozen=True)
class GGMLTensor:
    """A 2-D [out, in] weight in GGML blocks: `rows` is [out, in / block_size * type_size] uint8."""

    ggml_type: int
    rows: np.ndarray
    shape: tuple[int, int]
    #: where the blocks came from (file identity, tensor, then any row selection), so what is
    #: derived from them at load (a backend's repacked layout) can be cached; "" when unknown
    origin: str = ""

    ndim = 2
    #: what `__array__` yields, so code written for arrays converts it like any float tensor
    dtype = np.dtype(np.float32)

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.ggml_type).name

    def dequantize(self) -> np.ndarray:
        """float32 [out, in], bit-identical to `gguf.quants.dequantize`."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        qtype = GGMLQuantizationType(self.ggml_type)
        fast = _FAST_DEQUANTIZERS.get(qtype.name)
        if fast is not None:
            return fast(np.asarray(self.rows, np.uint8)).reshape(self.shape)
        return dequantize(self.rows, qtype).reshape(self.shape)

    def take_rows(self, order: np.ndarray) -> GGMLTensor:
        """The matrix with its output rows reordered (blocks run along `in`, so rows move whole)."""
        digest = hashlib.sha256(np.ascontiguousarray(order, np.int64).tobytes()).hexdigest()[:16]
        return GGMLTensor(
            self.ggml_type, np.ascontiguousarray(self.rows[order]), self.shape, self.derived(f"rows {digest}")
        )

    def derived(self, how: str) -> str:
        """The origin of a tensor made from this one's blocks by `how` ("" when this one's is unknown)."""
        return f"{self.origin}|{how}" if self.origin else ""

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.dequantize()
        return array if dtype is None else array.astype(dtype, copy=False)
