"""A GGUF-quantised matrix kept in its blocks until a backend decides how to use it.

Backends with kernels for the block format (the cpu backend's native Q4_1/Q8_0 products) take
the blocks as they are; everything else sees a float32 array through `__array__`, dequantised
with `gguf` exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GGMLTensor:
    """A 2-D [out, in] weight in GGML blocks: `rows` is [out, in / block_size * type_size] uint8."""

    ggml_type: int
    rows: np.ndarray
    shape: tuple[int, int]

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

        return dequantize(self.rows, GGMLQuantizationType(self.ggml_type)).reshape(self.shape)

    def take_rows(self, order: np.ndarray) -> GGMLTensor:
        """The matrix with its output rows reordered (blocks run along `in`, so rows move whole)."""
        return GGMLTensor(self.ggml_type, np.ascontiguousarray(self.rows[order]), self.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.dequantize()
        return array if dtype is None else array.astype(dtype, copy=False)
