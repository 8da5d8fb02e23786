"""Linear weights the cuda backend keeps packed on the device, and their products.

`linear_weight` parts arrive from the loader as float arrays, `WeightOnlyTensor`s (`quantization=`
wint8 / wint4 / fp8, quantised on the host while loading) or `GGMLTensor`s (a GGUF checkpoint).
(Triton is imported only by the launcher: this module is safe without it.) `packed_parts` decides whether they stay packed: weight-only parts of one kind, or GGUF parts of
one type the kernels read in their blocks (Q8_0, Q4_0, Q4_K, Q6_K), are stacked along the outputs and sent
as they are; anything else is dequantised to the compute dtype as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.weight_only import WeightOnlyTensor, concat_rows

#: GGUF block types the kernels read in their blocks
GGUF_BLOCK_TYPES = ("Q8_0", "Q4_0", "Q4_K", "Q6_K")


@dataclass(frozen=True)
class HostPacked:
    """A linear weight's packed host arrays, ready to go to the device."""

    format: str
    weight: np.ndarray
    scales: np.ndarray | None
    out_features: int
    in_features: int
    group_size: int = 0


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear weight packed on the device (`triton_quant` reads it); `shape` is [in, out], as a
    float weight's."""

    format: str
    weight: Any
    scales: Any | None
    out_features: int
    in_features: int
    group_size: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.in_features, self.out_features)


def packed_parts(parts: Sequence[Any]) -> HostPacked | None:
    """The parts of one linear layer stacked along their outputs in a packed format, or None
    (they are float, or mixed, or in a GGUF type without a kernel)."""
    if all(isinstance(part, WeightOnlyTensor) for part in parts):
        joined = concat_rows(parts)
        if joined is None:
            return None
        out, inp = joined.shape
        return HostPacked(joined.kind, joined.qweight, joined.scales, out, inp, joined.group_size)
    if all(isinstance(part, GGMLTensor) for part in parts):
        kinds = {part.type_name for part in parts}
        if len(kinds) != 1 or next(iter(kinds)) not in GGUF_BLOCK_TYPES:
            return None
        rows = np.concatenate([np.asarray(part.rows, np.uint8) for part in parts], axis=0)
        out = sum(part.shape[0] for part in parts)
        return HostPacked(next(iter(kinds)), np.ascontiguousarray(rows), None, out, parts[0].shape[1])
    return None
