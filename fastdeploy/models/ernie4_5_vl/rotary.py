"""Rotary tables of ERNIE-4.5-VL: 3-D positions for the text model, 2-D for the vision tower.

Both are built per forward pass on the host as per-token cos/sin rows, which the backends'
rotate-half `rotary_embedding` reads with positions 0..tokens-1; so no backend needs a new op.

Text model (transformers' `Ernie4_5_VLMoeTextRotaryEmbedding`): frequency i of a head (pair
(2i, 2i+1) in the checkpoint's interleaved layout, i.e. dimensions (i, i + d/2) once the model
has permuted its q/k rows to rotate-half order) turns by position x inv_freq[i], where the
position is the token's height coordinate for even i below h+w (= mrope_section[0] +
mrope_section[1]), its width coordinate for odd i below that, and its time coordinate for the last
mrope_section[2] frequencies. Text tokens have equal coordinates, so this is ordinary rotary.

Vision tower (`Ernie4_5_VLMoeVisionRotaryEmbedding`): head_dim/4 frequencies; the first half of
the rotated dimensions turn with the patch row, the second half with the patch column.
"""

from __future__ import annotations

import numpy as np


def inverse_frequencies(base: float, dim: int) -> np.ndarray:
    return 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def text_axes(head_dim: int, section: list[int]) -> np.ndarray:
    """For each of the head_dim/2 frequencies, the position axis it uses: 0 time, 1 height, 2 width."""
    spatial = section[0] + section[1]
    axes = np.zeros(head_dim // 2, dtype=np.int64)
    axes[:spatial:2] = 1
    axes[1:spatial:2] = 2
    return axes


def text_tables(
    positions: np.ndarray, inv_freq: np.ndarray, axes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [tokens, head_dim/2] float32 for positions [3, tokens] (time, height, width)."""
    angles = positions[axes].T.astype(np.float64) * inv_freq
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def vision_patch_coordinates(grid_thw: tuple[int, int, int], merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of each patch, in the processor's order: frame, merge block, inside the block."""
    t, h, w = grid_thw
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.tile(rows, t), np.tile(cols, t)


def vision_tables(
    grid_thw: tuple[int, int, int], head_dim: int, theta: float, merge: int
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [patches, head_dim/2] float32 of one image or video."""
    inv_freq = inverse_frequencies(theta, head_dim // 2)
    rows, cols = vision_patch_coordinates(grid_thw, merge)
    angles = np.concatenate([np.outer(rows, inv_freq), np.outer(cols, inv_freq)], axis=1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
