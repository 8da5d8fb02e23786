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

from fastdeploy.formats.ggml_types import dequantize_reference, ggml_type


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


#: Q6_K's 6-bit integers of one half super-block: the low nibble or the high one (index 2) of the
#: first or second 32 bytes of `ql` (index 3), with bits (4 * nibble + 2 * part) of `qh` on top
_Q6_K_SHIFTS = np.array([[0, 2], [4, 6]], np.uint8).reshape(1, 1, 2, 2, 1)
#: super-blocks dequantised at a time (16 Mi values): bounds the temporaries of a large embedding
_Q6_K_CHUNK = 1 << 16


def _dequantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """d * scale * (q - 32) per 16-value sub-block of a 210-byte super-block (128 bytes of low
    nibbles, 64 of high bit pairs, 16 int8 scales, float16 d), in gguf's order of operations."""
    blocks = rows.reshape(-1, 210)
    out = np.empty((len(blocks), 256), np.float32)
    for first in range(0, len(blocks), _Q6_K_CHUNK):
        chunk = blocks[first : first + _Q6_K_CHUNK]
        count = len(chunk)
        low = chunk[:, :128].reshape(count, 2, 1, 2, 32)
        low = np.concatenate([low & 0x0F, low >> 4], axis=2)  # [block, half, nibble, part, 32]
        high = (chunk[:, 128:192].reshape(count, 2, 1, 1, 32) >> _Q6_K_SHIFTS) & 3
        q = ((low | high << 4).view(np.int8) - np.int8(32)).astype(np.float32).reshape(count, 16, 16)
        d = chunk[:, 208:210].copy().view(np.float16).astype(np.float32)
        scales = d * chunk[:, 192:208].view(np.int8).astype(np.float32)
        np.multiply(scales[:, :, None], q, out=out[first : first + count].reshape(count, 16, 16))
    return out.reshape(rows.shape[0], -1)


#: why not gguf's dequantisers for these: they loop over small groups in Python (SmolLM2's Q8_0
#: embedding took ~0.4 s of CPU, a quarter of the start-up budget; an ERNIE-4.5-0.3B-shaped Q6_K
#: embedding, the type llama.cpp's K-quant files give it, ~14 s); tests check bit equality.
_FAST_DEQUANTIZERS = {"Q8_0": _dequantize_q8_0, "Q4_1": _dequantize_q4_1, "Q6_K": _dequantize_q6_k}


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
        return ggml_type(self.ggml_type).name

    def dequantize(self) -> np.ndarray:
        """float32 [out, in], bit-identical to `gguf.quants.dequantize`."""
        # a plain view of memory-mapped rows: every intermediate of a memmap is a memmap too, whose
        # bookkeeping took ~15% of dequantising a 100k-row Q6_K embedding
        rows = self.rows.view(np.ndarray)
        fast = _FAST_DEQUANTIZERS.get(self.type_name)
        if fast is not None:
            return fast(np.asarray(rows, np.uint8)).reshape(self.shape)
        return dequantize_reference(rows, self.ggml_type).reshape(self.shape)

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
