"""Guided decoding's token mask on the device, written once over the tensor runtime.

The host sends the packed bitmask as bytes (vocab / 8 per row, 6 KiB for a 49k vocabulary), not
the logits. On the device each byte indexes a 256 x 8 table whose entry is 0 where the byte's bit
is set and -inf where it is not; the looked-up rows, laid end to end, are an additive mask of the
vocabulary (bit order: token t is bit t % 8 of byte t // 8, what little-endian int32 words give).
Adding 0 leaves a logit exactly as it was, adding -inf forbids it. Only the runtime's
`from_numpy`, `cast`, `index_select` and `index_copy_` are used, so paddle and torch, on a GPU or
the host, and the reference and Triton kernel choices all run this one implementation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdeploy.backends.cuda.runtimes import TensorRuntime

#: TABLE[b, j] == 0 when bit j of byte b is set, -inf otherwise
_TABLE = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, 0.0, -np.inf).astype(np.float32)


class TokenBitmask:
    """Applies host bitmasks to device logits; keeps the lookup table per logits dtype."""

    def __init__(self, rt: TensorRuntime) -> None:
        self.rt = rt
        self._tables: dict[str, Any] = {}

    def _table(self, dtype: str) -> Any:
        if dtype not in self._tables:
            self._tables[dtype] = self.rt.from_numpy(_TABLE, dtype)
        return self._tables[dtype]

    def apply(self, logits: Any, bitmask: np.ndarray, rows: np.ndarray) -> Any:
        """`logits[rows[i], t] = -inf` where bit t of `bitmask[i]` is 0; returns the masked logits.

        `bitmask` is host int32 [len(rows), words]; `logits` [num_rows, vocab] on the device. The
        rows are changed in place, except when every row is masked in order: then one addition
        makes a new tensor (no gather and scatter).
        """
        rt = self.rt
        vocab = logits.shape[-1]
        packed = np.ascontiguousarray(bitmask, dtype="<i4").view(np.uint8)
        codes = rt.cast(rt.from_numpy(packed.reshape(-1)), "int32")  # index_select takes no uint8
        penalty = rt.index_select(self._table(rt.dtype_name(logits)), codes)
        penalty = penalty.reshape([packed.shape[0], packed.shape[1] * 8])[:, :vocab]
        if len(rows) == logits.shape[0] and np.array_equal(rows, np.arange(len(rows))):
            return logits + penalty
        index = rt.from_numpy(np.asarray(rows, dtype=np.int64))
        rt.index_copy_(logits, index, rt.index_select(logits, index) + penalty)
        return logits
