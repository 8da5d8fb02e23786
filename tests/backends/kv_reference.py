"""What a KV cache of each `kv_cache_dtype` holds, computed independently of the backend's code:
the reference attention of the kernel tests attends over these values."""

from __future__ import annotations

import numpy as np

from fastdeploy.backends.base import BatchLayout

KV_DTYPES = ["float32", "float16", "bfloat16", "int8"]


def cached_values(x: np.ndarray, kv_dtype: str) -> np.ndarray:
    """What a KV cache of `kv_dtype` holds for float32 keys/values x [..., head_dim]: float16 and
    bfloat16 round to nearest even, int8 keeps round(x * 127 / max|x|) and the scale max|x| / 127
    per vector."""
    x = x.astype(np.float32)
    if kv_dtype == "int8":
        peak = np.abs(x).max(axis=-1, keepdims=True)
        levels = np.rint(x * (np.float32(127) / peak))
        return levels.astype(np.float64) * (peak / np.float32(127)).astype(np.float64)
    if kv_dtype == "bfloat16":
        import ml_dtypes

        return x.astype(ml_dtypes.bfloat16).astype(np.float64)
    return x.astype(kv_dtype).astype(np.float64)


def one_sequence_layout(table: np.ndarray, start: int, end: int, block_size: int) -> BatchLayout:
    """The pass of one sequence computing positions start..end-1 over block table `table`."""
    positions = np.arange(start, end)
    return BatchLayout(
        input_ids=np.zeros(end - start, np.int64),
        positions=positions,
        slot_mapping=table[positions // block_size] * block_size + positions % block_size,
        query_lens=np.array([end - start]),
        context_lens=np.array([end]),
        block_tables=table[None, :],
        logits_indices=np.array([end - start - 1]),
        block_size=block_size,
    )
