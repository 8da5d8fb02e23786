"""int8 activations (FD_CPU_ACTIVATIONS=int8) against a numpy reference of the same numerics.

The reference quantises each 32-value block of an activation row as the kernels promise
(scale = max|x| / 127, q = round(x * 127 / max|x|) to nearest even, clipped to +-127), takes exact
integer dot products with the GGUF quants (read from the file's bytes, not from our packing) and
combines them in float64. Both instruction sets must give the same bits: AVX-512 (VNNI where the
CPU has it) and AVX2.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor

pytestmark = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"native kernels: {native.unavailable_reason()}"
)
ISAS = [
    pytest.param(
        isa, marks=pytest.mark.skipif(native.best_isa() != "avx512" and isa == "avx512", reason="no AVX-512")
    )
    for isa in native.ISAS
]


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [tokens, in] float32 as the kernels quantise it: q [tokens, in/32, 32] (int64) and each
    32-value block's scale [tokens, in/32] (float64 of the kernels' float32)."""
    blocks_x = x.reshape(x.shape[0], -1, 32)
    peak = np.abs(blocks_x).max(axis=-1, keepdims=True)
    inverse = np.divide(np.float32(127), peak, out=np.zeros_like(peak), where=peak > 0)
    q = np.clip(np.rint(blocks_x * inverse), -127, 127).astype(np.int64)
    return q, (peak[..., 0] / np.float32(127)).astype(np.float64)


def int8_reference(x: np.ndarray, rows: np.ndarray, type_name: str, out_features: int) -> np.ndarray:
    """x [tokens, in] times GGUF rows [out, in/32 * block bytes] with int8-quantised activations."""
    q, scale = quantize_activations(x)  # [tokens, blocks, 32], [tokens, blocks]
    size = 20 if type_name == "Q4_1" else 34
    blocks_w = rows.reshape(out_features, -1, size)
    d = blocks_w[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)  # [out, blocks]
    if type_name == "Q4_1":
        m = blocks_w[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        nibbles = blocks_w[..., 4:]
        w = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.int64)
        dot = np.einsum("tbk,obk->tob", q, w)
        per_block = d[None] * dot + m[None] * q.sum(axis=-1)[:, None, :]
    else:
        w = np.maximum(blocks_w[..., 2:].view(np.int8).astype(np.int64), -127)
        per_block = d[None] * np.einsum("tbk,obk->tob", q, w)
    return (scale[:, None, :] * per_block).sum(axis=-1)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("tokens", [1, 3, 8, 9, 17, 40])
def test_int8_kernels_match_the_reference_and_each_other(type_name, tokens):
    rng = np.random.default_rng(tokens)
    weights = rng.standard_normal((72, 256)).astype(np.float32)  # 4.5 panels: a partial one
    qtype = GGMLQuantizationType[type_name]
    rows = quantize(weights, qtype)
    x = rng.standard_normal((tokens, 256)).astype(np.float32)
    x[:, 7] *= 50  # an outlier channel, as residual streams have
    x[0, 32:64] = 0.0  # an all-zero block: scale 0
    packed = native.pack([GGMLTensor(int(qtype), rows, weights.shape)], activations="int8")
    expected = int8_reference(x, rows, type_name, 72)
    outputs = [native.matmul(x, packed, isa, threads=2) for isa in native.ISAS if runs_here(isa)]
    for out in outputs:
        np.testing.assert_allclose(out, expected, rtol=2e-6, atol=2e-6 * np.abs(expected).max())
        np.testing.assert_array_equal(out, outputs[0])
    exact = x.astype(np.float64) @ dequantize(rows, qtype).reshape(weights.shape).T
    error = np.abs(outputs[0] - exact).max() / np.abs(exact).max()
    assert 1e-4 < error < 5e-2  # int8 activations are approximate, not broken


def runs_here(isa: str) -> bool:
    return native.ISAS.index(isa) >= native.ISAS.index(native.best_isa())


def each_dot(vbmi_fallback: bool = True):
    """(isa, dot cap) for every instruction set and dot instruction this CPU has, the cap set while
    the caller runs (and lifted afterwards); with `vbmi_fallback`, AVX-512 VNNI ("2") also without
    AVX512_VBMI's vpermb ("2-permd": the sub-block few-row kernels' fallback) where the CPU has it."""
    try:
        for isa in (isa for isa in native.ISAS if runs_here(isa)):
            for cap in range(native._native.int8_dots(isa, -1) + 1):
                assert native._native.int8_dots(isa, cap) == cap
                yield isa, cap
                if vbmi_fallback and cap == 2 and native._native.int8_vbmi(0) != native._native.int8_vbmi(1):
                    native._native.int8_vbmi(0)
                    yield isa, "2-permd"
                    native._native.int8_vbmi(1)
            native._native.int8_dots("avx2", 2)
    finally:
        native._native.int8_dots("avx2", 2)  # no cap
        native._native.int8_vbmi(1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_each_row_count_gives_each_row_the_many_rows_bits(isa, type_name):
    """Up to 4 rows (decoding) gemm_int8.c's kernels run, from 5 the regrouped tiles of
    gemm_blocks_int8.c (6 or 2 rows, padded): a row's bits depend on neither, nor on the rows beside it."""
    if not runs_here(isa):
        pytest.skip(f"no {isa} here")
    rng = np.random.default_rng(5)
    qtype = GGMLQuantizationType[type_name]
    rows = quantize(rng.standard_normal((90, 256)).astype(np.float32), qtype)
    packed = native.pack([GGMLTensor(int(qtype), rows, (90, 256))], activations="int8")
    x = rng.standard_normal((70, 256)).astype(np.float32)
    many_rows = native.matmul(x, packed, isa, threads=2)
    np.testing.assert_allclose(
        many_rows, int8_reference(x, rows, type_name, 90), rtol=2e-6, atol=2e-6 * np.abs(many_rows).max()
    )
    for count in [*range(1, 15), 33]:
        for start in (0, 70 - count):
            np.testing.assert_array_equal(
                native.matmul(x[start : start + count], packed, isa, threads=2),
                many_rows[start : start + count],
                err_msg=f"{count} rows from row {start}",
            )


def extreme_weights(type_name: str, cols: int) -> tuple[np.ndarray, native.PackedWeight]:
    """`cols` x 512 weights at their type's largest integers (Q8_0 +-127, Q4_1 15 and 0): the GGUF
    rows and their int8-activation packing."""
    qtype = GGMLQuantizationType[type_name]
    signs = np.where(np.arange(cols) % 3 == 0, -1.0, 1.0).astype(np.float32)
    weights = np.repeat(signs[:, None], 512, axis=1)
    weights[:, ::32] = 0.0  # Q4_1: a block's minimum 0 (or maximum), so the others quantise to 15 (or 0)
    rows = quantize(weights, qtype)
    return rows, native.pack([GGMLTensor(int(qtype), rows, (cols, 512))], activations="int8")


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_every_dot_instruction_gives_the_same_bits_at_the_extremes(type_name):
    """Weights at their largest integers (Q8_0 +-127, Q4_1 15 and 0) times activations at +-127: the AVX2
    sign trick and maddubs sums (16-bit) and the VNNI dots, capped to each this CPU has, agree."""
    rows, packed = extreme_weights(type_name, 40)
    x = np.repeat(np.where(np.arange(11) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None], 512, axis=1)
    expected = int8_reference(x, rows, type_name, 40)
    outputs: dict[str, list[np.ndarray]] = {}
    for isa, _ in each_dot(vbmi_fallback=False):  # gemm_int8.c's kernels do not transpose
        outputs.setdefault(isa, []).append(native.matmul(x, packed, isa, threads=2))
    for per_isa in outputs.values():
        for out in per_isa:
            np.testing.assert_array_equal(out, per_isa[0])
            np.testing.assert_allclose(out, expected, rtol=2e-6, atol=2e-6 * np.abs(expected).max())


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("out_features", [16, 40, 80, 107, 144])
def test_one_to_four_rows_get_the_many_rows_bits_under_every_dot_instruction(type_name, out_features):
    """Up to 4 rows gemm_int8.c reads the panels two at a time (one row; AVX-512 every row) in tasks of
    four panels, with AVX-512 VNNI, AVX-VNNI or maddubs dots: 1, 3, 5, 7 and 9 panels (a pair cut
    short, a partial last panel) under each dot cap and thread count give each row the bits of a
    many-row product, which matches the float64 reference of the quantised numerics."""
    rng = np.random.default_rng(out_features)
    qtype = GGMLQuantizationType[type_name]
    rows = quantize(rng.standard_normal((out_features, 160)).astype(np.float32), qtype)
    packed = native.pack([GGMLTensor(int(qtype), rows, (out_features, 160))], activations="int8")
    x = rng.standard_normal((12, 160)).astype(np.float32)
    x[:, 5] *= 40  # an outlier channel
    x[3, 64:96] = 0.0  # an all-zero block: scale 0
    bias = rng.standard_normal(out_features).astype(np.float32)
    many_rows = native.matmul(x, packed, native.best_isa(), threads=2, bias=bias)
    expected = int8_reference(x, rows, type_name, out_features) + bias
    np.testing.assert_allclose(many_rows, expected, rtol=2e-6, atol=2e-6 * np.abs(expected).max())
    for isa, cap in each_dot(vbmi_fallback=False):
        for count in range(1, 5):
            for start in (0, 3, 12 - count):
                for threads in (1, 2):
                    np.testing.assert_array_equal(
                        native.matmul(x[start : start + count], packed, isa, threads, bias=bias),
                        many_rows[start : start + count],
                        err_msg=f"{isa}, dots {cap}, {count} rows from row {start}, {threads} threads",
                    )


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_one_to_four_rows_at_the_extremes_under_every_dot_instruction(type_name):
    """The extremes test's weights and activations (Q8_0 +-127, Q4_1 15 and 0, x +-127) in products of
    1 to 4 rows: the few-row kernels' sign trick, 16-bit maddubs sums and VNNI dots stay exact."""
    rows, packed = extreme_weights(type_name, 56)
    x = np.repeat(np.where(np.arange(4) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None], 512, axis=1)
    expected = int8_reference(x, rows, type_name, 56)
    for isa, cap in each_dot(vbmi_fallback=False):
        for count in range(1, 5):
            out = native.matmul(x[:count], packed, isa, threads=2)
            np.testing.assert_allclose(
                out,
                expected[:count],
                rtol=2e-6,
                atol=2e-6 * np.abs(expected).max(),
                err_msg=f"{isa}, dots {cap}, {count} rows",
            )


def test_float_weights_stay_float32_under_int8_activations():
    weight = np.random.default_rng(1).standard_normal((40, 64)).astype(np.float32)
    packed = native.pack([weight], activations="int8")
    assert packed.type_name == "F32"
    np.testing.assert_array_equal(
        native.matmul(np.eye(64, dtype=np.float32), packed, native.best_isa(), 1), weight.T
    )


@pytest.mark.parametrize("isa", ISAS)
def test_the_engine_runs_int8_activations_end_to_end(monkeypatch, isa):
    """SmolLM2 with int8 activations: logprobs of a continuation near float32's, on each kernel set."""
    monkeypatch.setenv("FD_CPU_KERNELS", isa)
    prompt = "The capital of France is Paris. The capital of Germany is"
    params = SamplingParams(temperature=0, max_tokens=3, logprobs=1)
    results = {}
    for activations in ("float32", "int8"):
        monkeypatch.setenv("FD_CPU_ACTIVATIONS", activations)
        llm = LLM(max_model_len=256, max_num_seqs=2)
        assert f"{activations} activations" in llm.llm_engine.backend.describe()
        (output,) = llm.generate(prompt, params, use_tqdm=False)
        results[activations] = output.outputs
    assert results["int8"].text == results["float32"].text == " Berlin. The"
    first_int8, first_float = results["int8"].logprobs[0], results["float32"].logprobs[0]
    token = results["float32"].token_ids[0]
    assert abs(first_int8[token] - first_float[token]) < 0.1


def test_unknown_or_unrunnable_activations_are_refused(monkeypatch):
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", "int4")
    with pytest.raises(
        InvalidArgumentError, match="FD_CPU_ACTIVATIONS must be one of float32, int8; got 'int4'"
    ):
        CpuBackend(BackendOptions(threads=1))
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", "int8")
    monkeypatch.setenv("FD_CPU_KERNELS", "numpy")
    with pytest.raises(
        InvalidArgumentError, match="FD_CPU_ACTIVATIONS=int8 needs the cpu backend's native kernels"
    ):
        CpuBackend(BackendOptions(threads=1))
