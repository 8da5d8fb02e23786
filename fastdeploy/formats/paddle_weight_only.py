"""FastDeploy's pre-quantised `-Paddle` wint8 / wint4 weights, read into `WeightOnlyTensor`s.

FastDeploy quantises a `-Paddle` checkpoint with Paddle's `weight_quantize` (algo
`weight_only_int8` / `weight_only_int4`) and, for a pre-quantised checkpoint, stores that op's
output as is: `X.quant_weight` (int8) and `X.weight_scale`. The op lays the integers out for
CUTLASS's mixed-input GEMM on sm_75 and newer (one layout for sm_75 to sm_90), not as a matrix:

- each level is stored with a bias (int8: + 128, as a byte; int4: + 8, as a nibble, two per
  byte, the first in the low nibble);
- outputs are taken in groups of `I` columns (int8: 2, int4: 4); within a group, the inputs run
  in tiles of 64, and a tile holds the group's columns one after another;
- within a tile the 64 inputs are interleaved in blocks of 8 x R (int8: R = 2, int4: R = 4):
  position j of a block holds input (j // R) + 8 * (j % R).

This was established against Paddle's own CPU `weight_quantize` (tests/formats/), which writes the
same bytes as its GPU kernel. `quant_weight`'s nominal shape is [out, in] for int8 and
[out / 2, in] for int4; `weight_scale` is [out] (per channel, FastDeploy's default) or
[in / group, out] (group-wise). Undoing the layout is a permutation of bytes, done once at load;
no float copy is made. Per-channel int4 becomes `wint4` with groups of 128 (or 64) inputs sharing
the channel's scale, which is exact.
"""

from __future__ import annotations

import numpy as np

from fastdeploy.errors import WeightLoadError
from fastdeploy.formats.weight_only import WINT4_GROUP_SIZES, WeightOnlyTensor

#: inputs per tile of CUTLASS's layout
TILE = 64
#: (columns interleaved per group, inputs per interleaved run) for each kind
_INTERLEAVE = {"wint8": (2, 2), "wint4": (4, 4)}


def _tile_order(runs: int) -> np.ndarray:
    """For each position of a 64-input tile, the input stored there."""
    j = np.arange(TILE)
    block = 8 * runs
    return (j // block) * block + (j % block) // runs + 8 * (j % runs)


def _levels(quant_weight: np.ndarray, kind: str) -> np.ndarray:
    """The stored levels in storage order (int16, bias removed)."""
    stored = np.ascontiguousarray(quant_weight).view(np.uint8).ravel()
    if kind == "wint8":
        return stored.astype(np.int16) - 128
    levels = np.empty(stored.size * 2, np.int16)
    levels[0::2] = stored & 0x0F
    levels[1::2] = stored >> 4
    return levels - 8


def paddle_weight_only(
    quant_weight: np.ndarray, weight_scale: np.ndarray, kind: str, name: str
) -> WeightOnlyTensor:
    """`kind` ("wint8" or "wint4") weight `name` from `weight_quantize`'s layout into ours."""
    columns, runs = _INTERLEAVE[kind]
    if quant_weight.ndim != 2:
        raise WeightLoadError(f"{name}: a {kind} quant_weight is 2-D, got shape {list(quant_weight.shape)}")
    out = quant_weight.shape[0] * (2 if kind == "wint4" else 1)
    inp = quant_weight.shape[1]
    if inp % TILE or out % columns:
        raise WeightLoadError(
            f"{name}: {kind} weights in Paddle's CUTLASS layout need an input width that is a multiple of "
            f"{TILE} and an output width that is a multiple of {columns}; got [{out}, {inp}]"
        )
    scales = np.asarray(weight_scale, dtype=np.float32)
    if scales.ndim == 1:
        scales = scales[None, :]
    if scales.ndim != 2 or scales.shape[1] != out or inp % scales.shape[0]:
        raise WeightLoadError(
            f"{name}: weight_scale has shape {list(np.shape(weight_scale))}; expected [{out}] (per channel) "
            f"or [{inp} / group, {out}] for a {kind} weight of {out} outputs and {inp} inputs"
        )
    # storage order is (column group, tile, column in group, position in tile)
    stored = _levels(quant_weight, kind).reshape(out // columns, inp // TILE, columns, TILE)
    tiles = np.empty_like(stored)
    tiles[..., _tile_order(runs)] = stored
    levels = tiles.transpose(0, 2, 1, 3).reshape(out, inp)  # [out, in]
    groups = scales.shape[0]
    if kind == "wint8":
        if groups != 1:
            raise WeightLoadError(f"{name}: wint8 has one scale per output channel, got {groups} groups")
        return WeightOnlyTensor(
            "wint8", np.ascontiguousarray(levels.T.astype(np.int8)), scales[0], (out, inp)
        )
    group = inp // groups
    if group not in WINT4_GROUP_SIZES:  # per channel (or a coarser group): repeat the scale per 128 / 64
        finer = next((size for size in reversed(WINT4_GROUP_SIZES) if group % size == 0), None)
        if finer is None:
            raise WeightLoadError(f"{name}: wint4 group of {group} inputs is not a multiple of 64")
        scales, group = np.repeat(scales, group // finer, axis=0), finer
    nibbles = (levels.T + 8).astype(np.uint8)  # [in, out]
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return WeightOnlyTensor(
        "wint4", np.ascontiguousarray(packed), np.ascontiguousarray(scales), (out, inp), group
    )
