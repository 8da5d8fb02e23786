"""Weight-only quantised matrices for GPU kernels: FastDeploy's `wint8`, `wint4` and block FP8.

A `WeightOnlyTensor` is a 2-D [out, in] weight kept in the packed form the cuda backend's Triton
kernels read (fastdeploy/backends/cuda/triton_quant.py); anything else converts it with
`np.asarray`, which dequantises it to float32 (as a `GGMLTensor` does).

Layouts (the ones FastDeploy's Triton weight-only paths use; docs/quantization.md has the table):

- `wint8`: int8 [in, out], symmetric per output channel: `scales` [out] float32 = max |w| / 127,
  w = q * scale.
- `wint4`: int4 with one scale per `group_size` inputs of each output (64 or 128), symmetric
  (max |w| / 7, levels -7..7), stored with a bias of 8 (FastDeploy's "uint4b8"): `qweight`
  [in / 2, out] uint8 holds inputs 2i (low nibble) and 2i + 1 (high nibble) of each output;
  `scales` [in / group_size, out] float32; w = (nibble - 8) * scale.
- `fp8`: e4m3 [out, in] (its bits as uint8) with one float32 scale per 128 x 128 block,
  `scales` [ceil(out / 128), ceil(in / 128)]: w = e4m3 * scale, the layout of DeepSeek-V3's and
  FastDeploy's block-wise FP8 checkpoints (`weight` and `weight_scale_inv`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

WEIGHT_ONLY_KINDS = ("wint8", "wint4", "fp8")
#: wint4 group sizes the kernels take (a group spans whole K tiles of 64)
WINT4_GROUP_SIZES = (64, 128)
FP8_BLOCK = 128
#: the largest finite e4m3 value
FP8_MAX = 448.0


@dataclass(frozen=True)
class WeightOnlyTensor:
    """A [out, in] weight in one of `WEIGHT_ONLY_KINDS` (see the module docstring for layouts)."""

    kind: str
    qweight: np.ndarray
    scales: np.ndarray
    shape: tuple[int, int]
    group_size: int = 0

    ndim = 2
    #: what `__array__` yields, so code written for arrays converts it like any float tensor
    dtype = np.dtype(np.float32)

    @property
    def nbytes(self) -> int:
        return int(self.qweight.nbytes + self.scales.nbytes)

    def dequantize(self) -> np.ndarray:
        """float32 [out, in]."""
        out, inp = self.shape
        if self.kind == "wint8":
            return (self.qweight.astype(np.float32) * self.scales[None, :]).T.copy()
        if self.kind == "wint4":
            levels = np.empty((inp, out), np.float32)
            levels[0::2] = (self.qweight & 0x0F).astype(np.float32) - 8
            levels[1::2] = (self.qweight >> 4).astype(np.float32) - 8
            scales = np.repeat(self.scales, self.group_size, axis=0)
            return (levels * scales).T.copy()
        values = self.qweight.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        scales = np.repeat(np.repeat(self.scales, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)
        return values * scales[:out, :inp]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.dequantize()
        return array if dtype is None else array.astype(dtype, copy=False)

    def take_rows(self, order: np.ndarray) -> WeightOnlyTensor:
        """The matrix with output rows `order` (a reordering or a slice of them). FP8 blocks span
        128 outputs, so an FP8 matrix is requantised from its values unless whole blocks move."""
        order = np.asarray(order, dtype=np.int64)
        if self.kind == "fp8":
            blocks = order.reshape(-1, FP8_BLOCK) if order.size % FP8_BLOCK == 0 else None
            aligned = blocks is not None and (blocks == blocks[:, :1] + np.arange(FP8_BLOCK)).all()
            if not (aligned and (blocks[:, 0] % FP8_BLOCK == 0).all()):
                return quantize_fp8(self.dequantize()[order])
            return WeightOnlyTensor(
                "fp8",
                np.ascontiguousarray(self.qweight[order]),
                np.ascontiguousarray(self.scales[blocks[:, 0] // FP8_BLOCK]),
                (order.size, self.shape[1]),
            )
        return WeightOnlyTensor(
            self.kind,
            np.ascontiguousarray(self.qweight[:, order]),
            np.ascontiguousarray(self.scales[..., order]),
            (order.size, self.shape[1]),
            self.group_size,
        )

    def take_columns(self, start: int, stop: int) -> WeightOnlyTensor | np.ndarray:
        """Inputs start:stop (a row-parallel shard); float32 where they split a scale group."""
        unit = {"wint8": 1, "wint4": self.group_size, "fp8": FP8_BLOCK}[self.kind]
        if start % unit or (stop - start) % unit:
            return self.dequantize()[:, start:stop]
        if self.kind == "wint8":
            qweight, scales = self.qweight[start:stop], self.scales
        elif self.kind == "wint4":
            qweight = self.qweight[start // 2 : stop // 2]
            scales = self.scales[start // unit : stop // unit]
        else:
            qweight, scales = self.qweight[:, start:stop], self.scales[:, start // unit : stop // unit]
        shape = (self.shape[0], stop - start)
        return WeightOnlyTensor(
            self.kind, np.ascontiguousarray(qweight), np.ascontiguousarray(scales), shape, self.group_size
        )


def quantize_wint8(matrix: np.ndarray) -> WeightOnlyTensor:
    """`wint8` of a float [out, in] matrix."""
    values = np.asarray(matrix, dtype=np.float32)
    scales = np.abs(values).max(axis=1) / 127
    inverse = np.divide(1.0, scales, out=np.zeros_like(scales), where=scales > 0)
    q = np.clip(np.rint(values * inverse[:, None]), -127, 127).astype(np.int8)
    return WeightOnlyTensor("wint8", np.ascontiguousarray(q.T), scales.astype(np.float32), values.shape)


def quantize_wint4(matrix: np.ndarray, group_size: int) -> WeightOnlyTensor:
    """`wint4` of a float [out, in] matrix whose `in` is a multiple of `group_size`."""
    values = np.asarray(matrix, dtype=np.float32)
    out, inp = values.shape
    if group_size not in WINT4_GROUP_SIZES or inp % group_size:
        raise ValueError(
            f"wint4 needs an input width that is a multiple of group_size {group_size}, got {inp}"
        )
    groups = values.T.reshape(inp // group_size, group_size, out)  # [groups, group, out]
    scales = np.abs(groups).max(axis=1) / 7  # [groups, out]
    inverse = np.divide(1.0, scales, out=np.zeros_like(scales), where=scales > 0)
    levels = np.clip(np.rint(groups * inverse[:, None, :]), -7, 7).astype(np.int16) + 8
    levels = levels.reshape(inp, out).astype(np.uint8)
    packed = levels[0::2] | (levels[1::2] << 4)
    return WeightOnlyTensor(
        "wint4", np.ascontiguousarray(packed), scales.astype(np.float32), (out, inp), group_size
    )


def quantize_fp8(matrix: np.ndarray) -> WeightOnlyTensor:
    """Block-wise e4m3 of a float [out, in] matrix: one scale per 128 x 128 block."""
    values = np.asarray(matrix, dtype=np.float32)
    out, inp = values.shape
    rows, cols = -(-out // FP8_BLOCK), -(-inp // FP8_BLOCK)
    padded = np.zeros((rows * FP8_BLOCK, cols * FP8_BLOCK), np.float32)
    padded[:out, :inp] = values
    blocks = padded.reshape(rows, FP8_BLOCK, cols, FP8_BLOCK)
    scales = np.abs(blocks).max(axis=(1, 3)) / FP8_MAX  # [rows, cols]
    inverse = np.divide(1.0, scales, out=np.zeros_like(scales), where=scales > 0)
    scaled = (blocks * inverse[:, None, :, None]).reshape(padded.shape)[:out, :inp]
    bits = np.clip(scaled, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return WeightOnlyTensor("fp8", np.ascontiguousarray(bits), scales.astype(np.float32), (out, inp))


def quantize_weight_only(matrix: np.ndarray, kind: str, group_size: int = 128) -> WeightOnlyTensor:
    """`kind` ("wint8", "wint4" or "fp8") of a float [out, in] matrix."""
    if kind == "wint8":
        return quantize_wint8(matrix)
    if kind == "wint4":
        return quantize_wint4(matrix, group_size)
    if kind == "fp8":
        return quantize_fp8(matrix)
    raise ValueError(f"unknown weight-only kind {kind!r}; known: {', '.join(WEIGHT_ONLY_KINDS)}")


def concat_rows(parts: Sequence[WeightOnlyTensor]) -> WeightOnlyTensor | None:
    """The parts stacked along their outputs (a fused qkv or gate/up), or None when they do not
    share a kind and group (or FP8 parts do not each hold whole 128-row blocks)."""
    first = parts[0]
    if any(p.kind != first.kind or p.group_size != first.group_size for p in parts):
        return None
    if any(p.shape[1] != first.shape[1] for p in parts):
        return None
    out = sum(p.shape[0] for p in parts)
    if first.kind == "fp8":
        if any(p.shape[0] % FP8_BLOCK for p in parts[:-1]):
            return None
        qweight = np.concatenate([p.qweight for p in parts], axis=0)
        scales = np.concatenate([p.scales for p in parts], axis=0)
        return WeightOnlyTensor("fp8", qweight, scales, (out, first.shape[1]))
    qweight = np.concatenate([p.qweight for p in parts], axis=1)
    scales = np.concatenate([p.scales for p in parts], axis=-1)
    return WeightOnlyTensor(first.kind, qweight, scales, (out, first.shape[1]), first.group_size)
