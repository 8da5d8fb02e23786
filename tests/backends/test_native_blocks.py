"""The block kernels of every GGUF type the cpu backend keeps (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
K-quants, IQ4_*, MXFP4) against `gguf`'s dequantisers and float64 products, on both instruction sets.

Weights are random valid blocks (random integers and sub-block scales, sane float16 scales), and
for the types `gguf.quants` can quantise also quantised real float data. Every product must
(a) reproduce gguf's dequantised float32 weights bit for bit through an identity input, (b) match a
float64 product of the dequantised weights, and (c) give each row the bits of the many-rows path
whatever the number of rows in the call (batch invariance).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize
from test_native_kernels import ISAS, requires_native

from fastdeploy.backends.cpu import native
from fastdeploy.formats.ggml_tensor import GGMLTensor

#: byte offsets of each type's float16 super-block factors inside a block (gguf's layouts)
HALF_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q8_0": (0,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "MXFP4": (),  # an e8m0 exponent byte instead (random_blocks)
}
NEW_TYPES = list(HALF_FIELDS)
LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4")  # 32-weight blocks
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # what gguf.quants.quantize makes


def random_blocks(
    type_name: str, rows: int, cols: int, seed: int = 0, exponents: tuple[float, float] = (-12, -4)
) -> GGMLTensor:
    """Random block bytes with float16 factors of either sign and magnitudes 2^exponents."""
    qtype = GGMLQuantizationType[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // block_size, type_size), dtype=np.uint8)
    for offset in HALF_FIELDS[type_name]:
        halves = (rng.choice([-1.0, 1.0], len(blocks)) * 2.0 ** rng.uniform(*exponents, len(blocks))).astype(
            np.float16
        )
        blocks[:, offset : offset + 2] = halves.view(np.uint8).reshape(-1, 2)
    if type_name == "MXFP4":  # exponents 2^(e - 128) of sane magnitudes, and the subnormal ones
        blocks[:, 0] = rng.choice([0, 1, 2, *range(112, 132)], len(blocks))
    return GGMLTensor(int(qtype), blocks.reshape(rows, -1), (rows, cols))


def quantized(type_name: str, rows: int, cols: int, seed: int = 0) -> GGMLTensor:
    weights = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    qtype = GGMLQuantizationType[type_name]
    return GGMLTensor(int(qtype), quantize(weights, qtype), (rows, cols))


def reference(tensor: GGMLTensor) -> np.ndarray:
    return dequantize(tensor.rows, GGMLQuantizationType(tensor.ggml_type)).reshape(tensor.shape)


def widths(type_name: str) -> list[int]:
    """Depths to test: multiples of 256 for every type; 32-multiples that are not (SmolLM2's 576)
    for the 32-weight block types."""
    return [256, 576, 96] if type_name in LEGACY else [256, 512]


def weights_of(type_name: str, rows: int, cols: int, seed: int) -> list[GGMLTensor]:
    made = [random_blocks(type_name, rows, cols, seed)]
    if type_name in QUANTIZABLE:
        made.append(quantized(type_name, rows, cols, seed))
    return made


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_identity_input_reproduces_gguf_dequantisation_exactly(isa, type_name):
    for cols in widths(type_name):
        for tensor in weights_of(type_name, 40, cols, seed=cols):
            packed = native.pack([tensor])
            assert packed.type_name == type_name
            out = native.matmul(np.eye(cols, dtype=np.float32), packed, isa, threads=2)
            np.testing.assert_array_equal(out, reference(tensor).T)
            # and the few-rows kernels, a column of the identity at a time
            for k in (0, cols // 2 + 3, cols - 1):
                unit = np.zeros((1, cols), np.float32)
                unit[0, k] = 1
                np.testing.assert_array_equal(
                    native.matmul(unit, packed, isa, threads=1)[0], reference(tensor)[:, k]
                )


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", NEW_TYPES)
@pytest.mark.parametrize("tokens", [1, 2, 3, 4, 5, 8, 16, 17, 33, 64])
def test_matmul_matches_float64_reference(isa, type_name, tokens):
    """Within float32 rounding of sums of up to 576 terms: rtol 2e-5 of the largest output."""
    for cols in widths(type_name):
        for tensor in weights_of(type_name, 72, cols, seed=tokens):
            x = np.random.default_rng(tokens).standard_normal((tokens, cols)).astype(np.float32)
            out = native.matmul(x, native.pack([tensor]), isa, threads=2)
            expected = x.astype(np.float64) @ reference(tensor).T.astype(np.float64)
            np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_each_row_count_equals_the_many_rows_path_bit_for_bit(isa, type_name):
    """One row takes four panels at once, few rows both panels of a pair or tiles of one panel, many
    rows a float buffer: every row count must give each row the bits of the many-rows path. 90
    columns: four full panels, then a pair whose second panel is partial (10 columns)."""
    cols = 256
    tensor = random_blocks(type_name, 90, cols, seed=3)
    packed = native.pack([tensor])
    x = np.random.default_rng(4).standard_normal((70, cols)).astype(np.float32)
    many_rows = native.matmul(x, packed, isa, threads=2)
    for rows in [*range(1, 18), 33, 64]:
        for start in (0, 70 - rows):
            np.testing.assert_array_equal(
                native.matmul(x[start : start + rows], packed, isa, threads=2),
                many_rows[start : start + rows],
                err_msg=f"{rows} rows from row {start}",
            )


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_one_row_over_every_panel_count(isa, type_name):
    """One row (a decode step) takes tasks of four panels in one tile (AVX2: row_tile, its totals in
    memory), and what is left of the panels in pairs and single panels: for 1 to 13 panels, whole
    or with a partial last one, with and without a bias, the row equals the float64 product within
    rounding and the bits of the many-rows path."""
    depth = 256 if type_name not in LEGACY else 96
    rng = np.random.default_rng(11)
    for cols in (16, 40, 64, 72, 100, 128, 144, 208):
        tensor = random_blocks(type_name, cols, depth, seed=cols)
        packed = native.pack([tensor])
        x = rng.standard_normal((9, depth)).astype(np.float32)
        bias = rng.standard_normal(cols).astype(np.float32)
        many_rows = native.matmul(x, packed, isa, threads=2)
        expected = x[:1].astype(np.float64) @ reference(tensor).T.astype(np.float64)
        for threads in (1, 2):
            row = native.matmul(x[:1], packed, isa, threads=threads)
            np.testing.assert_array_equal(row, many_rows[:1], err_msg=f"{cols} columns, {threads} threads")
            np.testing.assert_allclose(row, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
            np.testing.assert_array_equal(
                native.matmul(x[:1], packed, isa, threads=threads, bias=bias),
                row + bias,
                err_msg=f"{cols} columns",
            )


@requires_native
@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q5_1"])
def test_bias_and_fused_parts(type_name):
    """Fused parts (a qkv projection) pack like their stacked rows; the bias is added per column."""
    q, k = random_blocks(type_name, 32, 256, 1), random_blocks(type_name, 13, 256, 2)
    fused = native.pack([q, k])
    assert fused.type_name == type_name and fused.out_features == 45
    x = np.random.default_rng(3).standard_normal((5, 256)).astype(np.float32)
    bias = np.random.default_rng(5).standard_normal(45).astype(np.float32)
    out = native.matmul(x, fused, native.best_isa(), threads=2, bias=bias)
    expected = x.astype(np.float64) @ np.concatenate([reference(q), reference(k)]).T + bias
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


@requires_native
def test_a_shape_the_type_cannot_hold_is_refused():
    tensor = random_blocks("Q4_K", 16, 256)
    with pytest.raises(ValueError, match="buffer sizes do not match"):
        native._native.pack_blocks(native._native.KIND_Q4_K, tensor.rows, np.empty(10, np.uint8), 16, 256)


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("tokens", [1, 3, 17, 40])
def test_fused_parts_of_different_types_keep_their_types(isa, tokens):
    """A Q4_K_M layer's fused q/k/v: q and k in Q4_K, v in Q6_K (and a float32 part, and one of a
    type without a kernel): each segment runs its own kernel, so the product's columns equal each
    part's own product bit for bit, and the float64 reference within rounding."""
    q, k, v = (
        random_blocks("Q4_K", 32, 256, 1),
        random_blocks("Q4_K", 16, 256, 2),
        random_blocks("Q6_K", 16, 256, 3),
    )
    dense = np.random.default_rng(4).standard_normal((5, 256)).astype(np.float32)
    parts = [q, k, v, dense]
    fused = native.pack(parts)
    assert fused.type_name == "MIXED" and fused.segments == (("Q4_K", 48), ("Q6_K", 16), ("F32", 5))
    x = np.random.default_rng(tokens).standard_normal((tokens, 256)).astype(np.float32)
    bias = np.random.default_rng(6).standard_normal(69).astype(np.float32)
    out = native.matmul(x, fused, isa, threads=2, bias=bias)
    alone = [native.matmul(x, native.pack(group), isa, threads=2) for group in ([q, k], [v], [dense])]
    np.testing.assert_array_equal(out, np.concatenate(alone, axis=1) + bias)
    matrix = np.concatenate([reference(q), reference(k), reference(v), dense])
    expected = x.astype(np.float64) @ matrix.T.astype(np.float64) + bias
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


#: the byte ranges of each type's integers inside a block (gguf's layouts): low bits, then high bits
INTEGER_FIELDS = {
    "Q4_0": ((2, 18), None),
    "IQ4_NL": ((2, 18), None),
    "MXFP4": ((1, 17), None),
    "Q5_0": ((6, 22), (2, 6)),
    "Q5_1": ((8, 24), (4, 8)),
    "Q2_K": ((16, 80), None),
    "Q3_K": ((32, 96), (0, 32)),
    "Q4_K": ((16, 144), None),
    "Q5_K": ((48, 176), (16, 48)),
    "Q6_K": ((0, 128), (128, 192)),
    "IQ4_XS": ((8, 136), None),
}


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", list(INTEGER_FIELDS))
@pytest.mark.parametrize("pattern", ["zeros", "ones", "high bits set"])
def test_extreme_integers_in_every_kernel_shape(isa, type_name, pattern):
    """Every integer at its extremes (Q6_K's q = 0 and 63, the 5-bit types' high bit set
    everywhere, ...) decodes as gguf does, through the one-row, few-rows and many-rows kernels: an
    identity input, whole or a slice of rows at a time. 53 columns: three full panels and a partial
    fourth, past which the packing holds zeros; the 32-weight types at a depth of 96 (no super-block)."""
    depth = 96 if type_name in LEGACY else 256
    tensor = random_blocks(type_name, 53, depth, seed=7)
    blocks = tensor.rows.reshape(-1, GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]).copy()
    (low_start, low_end), high = INTEGER_FIELDS[type_name]
    if pattern != "high bits set":
        blocks[:, low_start:low_end] = 0 if pattern == "zeros" else 0xFF
    if high is not None:
        blocks[:, high[0] : high[1]] = 0 if pattern == "zeros" else 0xFF
    tensor = GGMLTensor(tensor.ggml_type, blocks.reshape(53, -1), (53, depth))
    expected = reference(tensor).T
    packed = native.pack([tensor])
    identity = np.eye(depth, dtype=np.float32)
    np.testing.assert_array_equal(native.matmul(identity, packed, isa, threads=2), expected)
    for rows in (1, 2, 3, 4, 8):
        out = np.concatenate(
            [native.matmul(identity[k : k + rows], packed, isa, threads=2) for k in range(0, depth, rows)]
        )
        np.testing.assert_array_equal(out, expected, err_msg=f"{rows} rows at a time")
