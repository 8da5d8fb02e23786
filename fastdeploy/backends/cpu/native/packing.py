"""Repacks weights into the column panels the native kernels stream: GGUF Q4_1/Q8_0 rows, and
float matrices of any other origin.

A GGUF matrix is [out, in] rows of 32-element blocks, each with its own scale (and minimum for
Q4_1). The kernels produce 16 output columns at a time, so the blocks of 16 consecutive rows are
interleaved: for one block index, the 16 rows' scales sit together and the quants are stored
k-major, so one 16-byte load holds one k for all 16 columns (two k's for 4-bit quants). See the
layout comment in gemm.c.
"""

from __future__ import annotations

import numpy as np

PANEL = 16
QBLOCK = 32
#: GGUF bytes per 32-weight block
Q4_1_BLOCK_BYTES = 20
Q8_0_BLOCK_BYTES = 34


def _panels(rows: np.ndarray, block_bytes: int) -> tuple[np.ndarray, int, int]:
    """[out, blocks, block_bytes] uint8 with `out` padded to whole panels (zero blocks = zero weights)."""
    out = rows.shape[0]
    blocks = rows.shape[1] // block_bytes
    padded = -(-out // PANEL) * PANEL
    grid = np.zeros((padded, blocks, block_bytes), np.uint8)
    grid[:out] = np.asarray(rows, np.uint8).reshape(out, blocks, block_bytes)
    return grid, padded // PANEL, blocks


def _panel_major(values: np.ndarray, panels: int, blocks: int) -> np.ndarray:
    """[panels*16, blocks, ...] -> [panels, blocks, 16, ...]: one panel's rows side by side per block."""
    shaped = values.reshape(panels, PANEL, blocks, *values.shape[2:])
    return np.moveaxis(shaped, 1, 2)


def pack_q4_1(rows: np.ndarray) -> np.ndarray:
    """Panels of a Q4_1 matrix given as GGUF rows ([out, in/32*20] uint8)."""
    grid, panels, blocks = _panels(rows, Q4_1_BLOCK_BYTES)
    scales = _panel_major(grid[..., 0:2], panels, blocks).reshape(panels, blocks, 2 * PANEL)
    minimums = _panel_major(grid[..., 2:4], panels, blocks).reshape(panels, blocks, 2 * PANEL)
    packed_pairs = grid[..., 4:]  # byte i: q[i] | q[i+16] << 4
    quants = np.concatenate([packed_pairs & 0x0F, packed_pairs >> 4], axis=-1)  # [rows, blocks, 32]
    quants = _panel_major(quants, panels, blocks)  # [panels, blocks, 16 columns, 32 k]
    pairs = quants[..., 0::2] | (quants[..., 1::2] << 4)  # [panels, blocks, 16 columns, 16 pairs]
    pairs = pairs.swapaxes(-1, -2).reshape(panels, blocks, QBLOCK // 2 * PANEL)
    return np.ascontiguousarray(np.concatenate([scales, minimums, pairs], axis=-1))


def pack_q8_0(rows: np.ndarray) -> np.ndarray:
    """Panels of a Q8_0 matrix given as GGUF rows ([out, in/32*34] uint8)."""
    grid, panels, blocks = _panels(rows, Q8_0_BLOCK_BYTES)
    scales = _panel_major(grid[..., 0:2], panels, blocks).reshape(panels, blocks, 2 * PANEL)
    quants = _panel_major(grid[..., 2:], panels, blocks)  # [panels, blocks, 16 columns, 32 k]
    quants = quants.swapaxes(-1, -2).reshape(panels, blocks, QBLOCK * PANEL)
    return np.ascontiguousarray(np.concatenate([scales, quants], axis=-1))


def pack_f32(matrix: np.ndarray) -> np.ndarray:
    """Panel pairs [pairs, in, 32] float32 of an [out, in] float matrix (out padded with zero rows)."""
    out, depth = matrix.shape
    pairs = -(-out // (2 * PANEL))
    padded = np.zeros((pairs * 2 * PANEL, depth), np.float32)
    padded[:out] = matrix
    return np.ascontiguousarray(padded.reshape(pairs, 2 * PANEL, depth).transpose(0, 2, 1))
