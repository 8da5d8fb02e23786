"""GGML tensor types as GGUF files number them: name, values per block, bytes per block.

Why not `gguf.constants`: importing any part of the `gguf` package imports all of it (its writer,
yaml, sentencepiece), ~50 ms of every start, for this table. The table holds the types of gguf
0.19 (the tests check it against the installed package's); a type it lacks is looked up in the
installed `gguf`, so a file with a newer type still reads wherever `gguf` knows it; and
`dequantize_reference` is where gguf's reference dequantisers are imported, when first used.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class GGMLType(NamedTuple):
    """One tensor type: a block of `block_size` values takes `type_size` bytes."""

    name: str
    block_size: int
    type_size: int


#: the type ids code refers to by name
F32 = 0
F16 = 1
MXFP4 = 39

#: type id -> GGMLType, as gguf's GGMLQuantizationType and GGML_QUANT_SIZES number and size them
TYPES: dict[int, GGMLType] = {
    0: GGMLType("F32", 1, 4),
    1: GGMLType("F16", 1, 2),
    2: GGMLType("Q4_0", 32, 18),
    3: GGMLType("Q4_1", 32, 20),
    6: GGMLType("Q5_0", 32, 22),
    7: GGMLType("Q5_1", 32, 24),
    8: GGMLType("Q8_0", 32, 34),
    9: GGMLType("Q8_1", 32, 40),
    10: GGMLType("Q2_K", 256, 84),
    11: GGMLType("Q3_K", 256, 110),
    12: GGMLType("Q4_K", 256, 144),
    13: GGMLType("Q5_K", 256, 176),
    14: GGMLType("Q6_K", 256, 210),
    15: GGMLType("Q8_K", 256, 292),
    16: GGMLType("IQ2_XXS", 256, 66),
    17: GGMLType("IQ2_XS", 256, 74),
    18: GGMLType("IQ3_XXS", 256, 98),
    19: GGMLType("IQ1_S", 256, 50),
    20: GGMLType("IQ4_NL", 32, 18),
    21: GGMLType("IQ3_S", 256, 110),
    22: GGMLType("IQ2_S", 256, 82),
    23: GGMLType("IQ4_XS", 256, 136),
    24: GGMLType("I8", 1, 1),
    25: GGMLType("I16", 1, 2),
    26: GGMLType("I32", 1, 4),
    27: GGMLType("I64", 1, 8),
    28: GGMLType("F64", 1, 8),
    29: GGMLType("IQ1_M", 256, 56),
    30: GGMLType("BF16", 1, 2),
    34: GGMLType("TQ1_0", 256, 54),
    35: GGMLType("TQ2_0", 256, 66),
    39: GGMLType("MXFP4", 32, 17),
    40: GGMLType("NVFP4", 64, 36),
    41: GGMLType("Q1_0", 128, 18),
}  # fmt: skip


def ggml_type(type_id: int) -> GGMLType | None:
    """The type GGUF numbers `type_id`, or None when neither this table nor `gguf` knows it."""
    known = TYPES.get(type_id)
    if known is not None:
        return known
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # a type newer than the table

    try:
        qtype = GGMLQuantizationType(type_id)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        return None
    return GGMLType(qtype.name, block_size, type_size)


def dequantize_reference(blocks: Any, type_id: int) -> Any:
    """float32 values of GGML `blocks` (uint8 rows) of type `type_id` through the `gguf` package's
    reference dequantiser: the one place that imports it, when a type has no faster path."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(blocks, GGMLQuantizationType(type_id))
