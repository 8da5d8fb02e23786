"""int8 activations (FD_CPU_ACTIVATIONS=int8) on the sub-block types (Q4_0, Q5_0, Q5_1, K-quants,
IQ4_*: gemm_blocks_int8.c) against float64 products of `gguf`'s dequantised weights with the
activations quantised per 32 values as the kernels promise (test_native_int8.quantize_activations).

In exact arithmetic the kernels' integer dot products, scaled per sub-block and activation block,
equal that product, so the only difference left is float32 rounding of a few terms per block. Both
instruction sets must give the same bits (the integer dots are exact, the float operations the same
and in the same order), and each row the bits of the many-rows path whatever the rows beside it.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from test_native_blocks import HALF_FIELDS, random_blocks, reference
from test_native_int8 import each_dot, quantize_activations
from test_native_kernels import ISAS, requires_native, runs_here

from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.cli.environment import collect_environment
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.plugins.registry import get_registry

SUBBLOCK_TYPES = ("Q4_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
FEW_ROWS = 4  # up to this many rows (decode) the panels are read straight (gemm_blocks_int8_rows.c)
BLOCKS_32 = ("Q4_0", "Q5_0", "Q5_1", "IQ4_NL")  # whole blocks of 32 k: depths need not be multiples of 256


def activations(tokens: int, cols: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((tokens, cols)).astype(np.float32)
    x[:, 7] *= 50  # an outlier channel, as residual streams have
    x[0, 32:64] = 0.0  # an all-zero block: scale 0
    return x


def int8_expected(x: np.ndarray, tensor) -> np.ndarray:
    q, scale = quantize_activations(x)
    dequantised_x = (q * scale[..., None]).reshape(x.shape)
    return dequantised_x @ reference(tensor).T.astype(np.float64)


@requires_native
@pytest.mark.parametrize("type_name", SUBBLOCK_TYPES)
@pytest.mark.parametrize("tokens", [5, 8, 9, 17, 40])
def test_int8_kernels_match_float64_products_of_quantised_activations(type_name, tokens):
    """72 columns: four full panels and a partial one; depths 256 and 512 (super-blocks)."""
    for cols in (256, 512):
        tensor = random_blocks(type_name, 72, cols, seed=tokens)
        packed = native.pack([tensor], activations="int8")
        assert packed.kind == getattr(native._native, f"KIND_{type_name}_I8")
        x = activations(tokens, cols, seed=cols + tokens)
        expected = int8_expected(x, tensor)
        outputs = [native.matmul(x, packed, isa, threads=2) for isa in native.ISAS if runs_here(isa)]
        for out in outputs:
            np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
            np.testing.assert_array_equal(out, outputs[0])
        exact = x.astype(np.float64) @ reference(tensor).T.astype(np.float64)
        error = np.abs(outputs[0] - exact).max() / np.abs(exact).max()
        assert 1e-4 < error < 5e-2  # int8 activations are approximate, not broken


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "IQ4_NL"])
def test_each_row_count_equals_the_many_rows_path_bit_for_bit(isa, type_name):
    """Every row count (the few-row kernels up to FEW_ROWS, then tiles of 6, 4 or 2 rows and their
    remainders) gives each row the bits of the many-rows path: decode and prefill of a token agree.
    200 columns: the few-row kernels' tasks of 8 panels, one whole and one of 5 whose last is partial."""
    cols = 256
    tensor = random_blocks(type_name, 200, cols, seed=3)
    packed = native.pack([tensor], activations="int8")
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
@pytest.mark.parametrize("type_name", SUBBLOCK_TYPES)
def test_few_rows_equal_the_same_rows_inside_a_larger_product_on_every_dot(type_name):
    """1-4 rows (decode: gemm_blocks_int8_rows.c) and 5 and 12 (the many-row tiles) of every
    sub-block type, under each instruction set and dot cap: the bits of the same rows computed among
    40, and the float64 product of the quantised activations and gguf's dequantised weights. 72
    columns: five panels (an odd count), the last partial; depths 256 and 512, and for the types of
    32-weight blocks 96 and 160 (not multiples of 256)."""
    for depth in (256, 512, 96, 160) if type_name in BLOCKS_32 else (256, 512):
        tensor = random_blocks(type_name, 72, depth, seed=depth)
        packed = native.pack([tensor], activations="int8")
        x = activations(40, depth, seed=depth + 1)
        expected = int8_expected(x, tensor)
        bias = np.random.default_rng(depth).standard_normal(72).astype(np.float32)
        reference_bits = None
        for isa, cap in each_dot():
            whole = native.matmul(x, packed, isa, threads=2, bias=bias)
            if reference_bits is None:
                reference_bits = whole
                np.testing.assert_allclose(
                    whole - bias, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max()
                )
            np.testing.assert_array_equal(whole, reference_bits, err_msg=f"{isa}, dots {cap}, depth {depth}")
            for rows in (*range(1, FEW_ROWS + 2), 12):
                for start in (0, 17, 40 - rows):
                    np.testing.assert_array_equal(
                        native.matmul(x[start : start + rows], packed, isa, threads=2, bias=bias),
                        whole[start : start + rows],
                        err_msg=f"{isa}, dots {cap}, depth {depth}: {rows} rows from row {start}",
                    )


@requires_native
def test_q6_k_int8_panels_take_seven_bits_a_weight():
    """Q6_K's int8 twin keeps its integers as nibbles and a plane of their two high bits (blocks.h):
    per group of 32 k and 16 columns its float16 d (32 bytes), int8 sub-block factors (32), nibbles
    (256) and high bits (128), 448 bytes or 7 bits a weight, where the float32 kernels' panels keep
    a byte per integer (576 bytes, 9 bits). Its values are checked by every test above and below."""
    tensor = random_blocks("Q6_K", 32, 512, seed=1)
    groups = 2 * 512 // 32  # two panels of 16 groups
    assert native.pack([tensor], activations="int8").packed.nbytes == groups * 448
    assert native.pack([tensor]).packed.nbytes == groups * 576


@requires_native
@pytest.mark.parametrize("type_name", SUBBLOCK_TYPES)
@pytest.mark.parametrize("weights", ["largest", "smallest"])
def test_few_rows_of_extreme_integers_on_every_dot(type_name, weights):
    """The few-row kernels' worst cases: every weight at its type's largest or smallest integer
    (Q6_K q = 63 or 0, the 5-bit types' high bit everywhere or nowhere) and every activation block
    at +-127, one to four rows, against float64 and the same bits on every dot (40 columns: two
    panels and a half)."""
    tensor = extreme_integers(type_name, 0xFF if weights == "largest" else 0x00)
    packed = native.pack([tensor], activations="int8")
    signs = np.where(np.arange(4) % 2 == 0, 1.0, -1.0).astype(np.float32)
    x = np.repeat(signs[:, None], 512, axis=1)
    x[3, ::3] *= -1  # mixed signs within a block
    expected = int8_expected(x, tensor)
    outputs = {}
    for isa, cap in each_dot():
        for rows in (1, 2, 3, 4):
            outputs[isa, cap, rows] = native.matmul(x[:rows], packed, isa, threads=1)
    isa, cap, _ = next(iter(outputs))
    four = outputs[isa, cap, 4]
    for (isa, cap, rows), out in outputs.items():
        np.testing.assert_array_equal(out, four[:rows], err_msg=f"{isa}, dots {cap}, {rows} rows")
    np.testing.assert_allclose(four, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


@requires_native
@pytest.mark.parametrize("isa", ISAS)
def test_fused_parts_of_different_types_take_int8_activations_each(isa):
    """A Q4_K_M layer's fused q/k/v (Q4_K and Q6_K parts) with int8 activations, and a bias."""
    q, v = random_blocks("Q4_K", 48, 256, 1), random_blocks("Q6_K", 16, 256, 3)
    fused = native.pack([q, v], activations="int8")
    assert fused.segments == (("Q4_K", 48), ("Q6_K", 16))
    x = activations(12, 256, seed=9)
    bias = np.random.default_rng(6).standard_normal(64).astype(np.float32)
    out = native.matmul(x, fused, isa, threads=2, bias=bias)
    expected = np.concatenate([int8_expected(x, q), int8_expected(x, v)], axis=1) + bias
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


def extreme_integers(type_name: str, byte: int) -> GGMLTensor:
    """Every weight bit set (byte 0xFF: each type's largest integer) or clear (0x00: its smallest,
    -offset), the float16 factors left random."""
    tensor = random_blocks(type_name, 40, 512, seed=7)
    blocks = tensor.rows.reshape(-1, GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]).copy()
    keep = np.zeros(blocks.shape[1], bool)
    for offset in HALF_FIELDS[type_name]:
        keep[offset : offset + 2] = True
    blocks[:, ~keep] = byte
    return GGMLTensor(tensor.ggml_type, blocks.reshape(tensor.rows.shape), tensor.shape)


@requires_native
@pytest.mark.parametrize("type_name", SUBBLOCK_TYPES)
@pytest.mark.parametrize("weights", ["random", "largest", "smallest"])
def test_every_dot_instruction_gives_the_same_bits(type_name, weights):
    """AVX2's maddubs (weights made non-negative by their type's offset, up to a whole sub-block's
    pairs summed in int16 where they fit; the codebook types signed, with the sign trick) and the
    VNNI dots (weights + 128) compute the same exact integer dots: capped to each dot this CPU has,
    the same bits. "largest"/"smallest": every weight at its type's largest/smallest integer and
    every activation at +-127 (the int16 sums' worst case), 11 rows (not a whole number of tiles)
    and 40 columns (two panels and a half)."""
    tensor = random_blocks(type_name, 40, 512, seed=7)
    if weights != "random":
        tensor = extreme_integers(type_name, 0xFF if weights == "largest" else 0x00)
    packed = native.pack([tensor], activations="int8")
    x = activations(11, 512, seed=8)
    if weights != "random":
        x = np.repeat(np.where(np.arange(11) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None], 512, axis=1)
    expected = int8_expected(x, tensor)
    try:
        for isa in (isa for isa in native.ISAS if runs_here(isa)):
            widest = native._native.int8_dots(isa, -1)
            outputs = []
            for cap in range(widest + 1):
                assert native._native.int8_dots(isa, cap) == cap
                outputs.append(native.matmul(x, packed, isa, threads=2))
            for out in outputs:
                np.testing.assert_array_equal(out, outputs[0])
            np.testing.assert_allclose(outputs[0], expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
    finally:
        native._native.int8_dots("avx2", 2)  # no cap


@requires_native
@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q5_K", "Q3_K", "IQ4_XS"])
@pytest.mark.parametrize("rows,cols", [(5, 17), (7, 33), (13, 50), (30, 16)])
def test_odd_row_and_column_counts_on_every_dot(type_name, rows, cols):
    """Row counts that leave a partial row tile (2 rows on AVX2, 6 or 4 on AVX-512) and column counts
    that leave a partial panel or pair, on each dot this CPU has, against float64 products."""
    tensor = random_blocks(type_name, cols, 256, seed=rows + cols)
    packed = native.pack([tensor], activations="int8")
    x = activations(rows, 256, seed=rows * cols)
    expected = int8_expected(x, tensor)
    bias = np.random.default_rng(cols).standard_normal(cols).astype(np.float32)
    try:
        outputs = []
        for isa in (isa for isa in native.ISAS if runs_here(isa)):
            for cap in range(native._native.int8_dots(isa, -1) + 1):
                native._native.int8_dots(isa, cap)
                outputs.append(native.matmul(x, packed, isa, threads=1, bias=bias))
            native._native.int8_dots("avx2", 2)
        for out in outputs:
            np.testing.assert_array_equal(out, outputs[0])
        np.testing.assert_allclose(outputs[0] - bias, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
    finally:
        native._native.int8_dots("avx2", 2)  # no cap


@requires_native
def test_fd_cpu_int8_dots_caps_the_dots_and_is_checked(monkeypatch):
    """FD_CPU_INT8_DOTS=maddubs makes this CPU run the plain AVX2 dots (a CPU without AVX-VNNI);
    a bad value is refused by name at construction; `fastdeploy env` reports it."""
    uncapped = {isa: native._native.int8_dots(isa, -1) for isa in native.ISAS if runs_here(isa)}
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", "int8")
    monkeypatch.setenv("FD_CPU_INT8_DOTS", "vnni")
    with pytest.raises(
        InvalidArgumentError,
        match="FD_CPU_INT8_DOTS must be one of auto, maddubs, avx-vnni, avx512-vnni; got 'vnni'",
    ):
        CpuBackend(BackendOptions(threads=1))
    try:
        monkeypatch.setenv("FD_CPU_INT8_DOTS", "maddubs")
        backend = CpuBackend(BackendOptions(threads=1))
        assert "int8 activations (AVX2 maddubs" in backend.describe()
        for isa in (isa for isa in native.ISAS if runs_here(isa)):
            assert native._native.int8_dots(isa, -1) == 0
        report = collect_environment(get_registry())
        assert report.env["FD_CPU_INT8_DOTS"] == "maddubs"
        monkeypatch.setenv("FD_CPU_INT8_DOTS", "auto")
        backend = CpuBackend(BackendOptions(threads=1))
        assert {isa: native._native.int8_dots(isa, -1) for isa in uncapped} == uncapped
    finally:
        native._native.int8_dots("avx2", 2)  # no cap


@requires_native
def test_an_unknown_instruction_set_is_refused():
    with pytest.raises(ValueError, match="instruction set sse2"):
        native._native.int8_dots("sse2", -1)
