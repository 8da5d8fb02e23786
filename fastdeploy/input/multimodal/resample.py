"""Antialiased bicubic resizing of uint8 frames, rounded exactly as torch's uint8 kernel rounds.

transformers' video processor resizes frames with torchvision, which runs torch's native uint8
bicubic kernel (antialias on). Its filter is Pillow's (a = -0.5, support widened by the scale
when shrinking, weights normalised per output pixel) but the weights are rounded to 16-bit
integers with the largest precision that keeps the biggest weight below 2^15, where Pillow keeps
22 fraction bits; about 0.5% of pixels then differ by one level. Videos go through this function
so their pixel values equal the reference processor's; images keep Pillow's resize, as
transformers' image processor does. Two separable integer passes, columns then rows; numpy
only, about a dozen multiply-adds per output value.
"""

from __future__ import annotations

import numpy as np


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def _integer_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(source index [out, taps], int weights [out, taps], fraction bits) of one axis."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inverse = 1.0 / scale if scale >= 1.0 else 1.0
    centers = scale * (np.arange(out_size) + 0.5)
    first = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    count = np.minimum((centers + support + 0.5).astype(np.int64), in_size) - first
    taps = np.arange(int(count.max()))
    weights = _cubic((taps[None, :] + first[:, None] - centers[:, None] + 0.5) * inverse)
    weights = np.where(taps[None, :] < count[:, None], weights, 0.0)
    total = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, total, out=weights, where=total != 0)
    biggest = weights.max()
    bits = 0
    while bits < 22 and int(0.5 + biggest * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    scaled = weights * (1 << bits)
    rounded = np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32)
    index = np.minimum(first[:, None] + taps[None, :], in_size - 1)
    return index, rounded, bits


def _resize_axis(data: np.ndarray, axis: int, out_size: int) -> np.ndarray:
    index, weights, bits = _integer_weights(data.shape[axis], out_size)
    shape = [1] * data.ndim
    shape[axis] = out_size
    acc = np.full(
        tuple(s if i != axis else out_size for i, s in enumerate(data.shape)), 1 << (bits - 1), np.int32
    )
    for tap in range(index.shape[1]):
        acc += np.take(data, index[:, tap], axis=axis).astype(np.int32) * weights[:, tap].reshape(shape)
    return np.clip(acc >> bits, 0, 255).astype(np.uint8)


def resize_uint8(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """[..., H, W, C] uint8 -> [..., height, width, C] uint8, as torch's antialiased bicubic
    uint8 resize (all frames of a clip at once)."""
    if frames.shape[-2] != width:
        frames = _resize_axis(frames, frames.ndim - 2, width)
    if frames.shape[-3] != height:
        frames = _resize_axis(frames, frames.ndim - 3, height)
    return frames
