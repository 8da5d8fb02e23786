"""Slicing host weights into a rank's shard before they reach the device.

Loaders hand over memory-mapped arrays and GGUF block matrices, so taking rows or columns here
reads only the rank's part of the file. Rows (output features) of a GGUF matrix are whole runs
of blocks and move as they are; columns (input features) stay in blocks when the cut falls on a
block boundary, and are dequantised to float32 otherwise. A `WeightOnlyTensor` (`quantization=`
on the cuda backend) does the same with its scale groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.ggml_types import ggml_type
from fastdeploy.formats.weight_only import WeightOnlyTensor


def take_rows(tensor: Any, rows: range) -> Any:
    """tensor[rows] (output features of an [out, in] matrix, or entries of a vector)."""
    if isinstance(tensor, GGMLTensor):
        return GGMLTensor(
            tensor.ggml_type,
            tensor.rows[rows.start : rows.stop],
            (len(rows), tensor.shape[1]),
            tensor.derived(f"rows {rows.start}:{rows.stop}"),
        )
    if isinstance(tensor, WeightOnlyTensor):
        return tensor if len(rows) == tensor.shape[0] else tensor.take_rows(np.arange(rows.start, rows.stop))
    return tensor[rows.start : rows.stop]


def take_columns(tensor: Any, columns: range) -> Any:
    """tensor[:, columns] (input features of an [out, in] matrix)."""
    if isinstance(tensor, GGMLTensor):
        _, block, block_bytes = ggml_type(tensor.ggml_type)
        if columns.start % block == 0 and len(columns) % block == 0:
            first = columns.start // block * block_bytes
            last = columns.stop // block * block_bytes
            return GGMLTensor(
                tensor.ggml_type,
                tensor.rows[:, first:last],
                (tensor.shape[0], len(columns)),
                tensor.derived(f"columns {columns.start}:{columns.stop}"),
            )
        tensor = np.asarray(tensor)
    if isinstance(tensor, WeightOnlyTensor):
        return tensor if len(columns) == tensor.shape[1] else tensor.take_columns(columns.start, columns.stop)
    return tensor[:, columns.start : columns.stop]


def take_head_rows(tensor: Any, heads: range, head_dim: int) -> Any:
    """The rows of attention heads `heads` (q/k/v projections and their biases)."""
    return take_rows(tensor, range(heads.start * head_dim, heads.stop * head_dim))


def pad_rows(tensor: Any, rows: int) -> Any:
    """`tensor` with zero rows appended up to `rows` (the last vocabulary shard of an uneven
    split, the embedding's zero row). A GGUF matrix stays in its blocks: all-zero bytes are a
    block of zeros in every GGML type (its scales are zero), and a rank then dequantises its
    embedding shard once instead of copying it again to pad it (~0.1 s of a rank's start-up)."""
    if tensor.shape[0] == rows:
        return tensor
    if isinstance(tensor, GGMLTensor):
        padding = np.zeros((rows - tensor.shape[0], tensor.rows.shape[1]), np.uint8)
        return GGMLTensor(
            tensor.ggml_type,
            np.concatenate([tensor.rows, padding]),
            (rows, tensor.shape[1]),
            tensor.derived(f"padded to {rows}"),
        )
    array = np.asarray(tensor, dtype=np.float32)
    padding = np.zeros((rows - array.shape[0], *array.shape[1:]), dtype=np.float32)
    return np.concatenate([array, padding])
