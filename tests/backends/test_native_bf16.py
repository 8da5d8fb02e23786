"""bfloat16 vision-encoder products (FD_CPU_VISION_MATMUL=bfloat16) against float64 references of
the same numerics.

The references round their inputs with ml_dtypes' bfloat16 (to nearest even, independent of the
kernels' rounding) and then compute in float64, so what remains is the kernels' float32 summation.
Each kernel path runs where this CPU allows: AVX512_BF16's `vdpbf16ps` and the AVX2 kernel that
widens bfloat16 to float32. Each test also checks that the result is not float32's, so a kernel
that skipped the rounding would fail.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.cli.environment import collect_environment
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.plugins.registry import get_registry

pytestmark = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"native kernels: {native.unavailable_reason()}"
)
NO_BF16 = "this CPU has no AVX512_BF16 (vdpbf16ps)"
#: (isa, whether it runs vdpbf16ps): the AVX-512 run is the BF16 kernel, so it needs BF16 hardware
KERNELS = [
    pytest.param("avx512", marks=pytest.mark.skipif(not native.has_bf16(), reason=NO_BF16), id="avx512_bf16"),
    pytest.param(
        "avx2", marks=pytest.mark.skipif(native.best_isa() == "none", reason="no AVX2"), id="avx2_widened"
    ),
]


def rounded(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 by ml_dtypes, as float64."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def test_rounding_is_to_nearest_even_and_keeps_specials():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(1000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 1000),
            # exact ties between two bfloat16 values: odd and even last kept bits
            np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000], np.uint32).view(np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.finfo(np.float32).max], np.float32),
        ]
    )
    bits = native.round_bf16(values)
    np.testing.assert_array_equal(bits, values.astype(ml_dtypes.bfloat16).view(np.uint16))
    # a NaN whose payload is only in the dropped bits stays NaN (plain rounding would give inf)
    nan = np.array([0x7F800001, 0xFFC00000], np.uint32).view(np.float32)
    assert np.isnan(native.round_bf16(nan).view(ml_dtypes.bfloat16).astype(np.float32)).all()
    # 16 at a time (the AVX-512 loop) as one at a time (its tail)
    mixed = np.concatenate([np.tile(nan, 9), np.linspace(-3, 3, 15, dtype=np.float32)])
    np.testing.assert_array_equal(
        native.round_bf16(mixed), [native.round_bf16(mixed[i : i + 1])[0] for i in range(mixed.size)]
    )


@pytest.mark.parametrize("isa", KERNELS)
@pytest.mark.parametrize(
    ("rows", "cols", "depth"),
    [(1, 16, 2), (5, 40, 33), (12, 32, 64), (13, 72, 64), (40, 100, 130), (300, 32, 96), (14, 48, 1024)],
)
def test_gemm_matches_a_float64_product_of_the_rounded_inputs(isa, rows, cols, depth):
    """Partial panels (cols not a multiple of 32), odd depth (a zero-padded k pair), row counts
    around the 12-row (AVX2: 4-row) tiles, a narrow weight split over row blocks (300 x 32), and
    activation rows padded apart (depth 1024)."""
    rng = np.random.default_rng(rows * cols + depth)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    x[:, 0] *= 40.0  # an outlier channel
    weight = rng.standard_normal((cols, depth)).astype(np.float32)
    bias = rng.standard_normal(cols).astype(np.float32)
    packed = native.pack_bf16([weight[: cols // 2], weight[cols // 2 :]])  # fused parts stack along out
    out = native.matmul(x, packed, isa, threads=2, bias=bias)
    expected = rounded(x) @ rounded(weight).T + bias
    # float32 sums of exact products: error within a few ulps of the sum of magnitudes
    bound = 4 * depth * 2.0**-24 * (np.abs(rounded(x)) @ np.abs(rounded(weight)).T + np.abs(bias))
    assert (np.abs(out - expected) <= bound).all()
    exact = x.astype(np.float64) @ weight.astype(np.float64).T + bias
    # much nearer the product of the rounded inputs than the float32 one: bfloat16 was multiplied
    assert np.abs(out - exact).max() > 100 * np.abs(out - expected).max()


def test_both_kernels_agree_and_the_weight_is_packed_once():
    if not native.has_bf16():
        pytest.skip(NO_BF16)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 200)).astype(np.float32)
    packed = native.pack_bf16([rng.standard_normal((70, 200)).astype(np.float32)])
    assert packed.type_name == "BF16" and packed.packed.dtype == np.uint16
    fast, widened = (native.matmul(x, packed, isa, threads=2) for isa in ("avx512", "avx2"))
    np.testing.assert_allclose(fast, widened, rtol=1e-5, atol=1e-5 * np.abs(widened).max())


def attention_reference(q, k, v, cu_seqlens, scale):
    """The kernel's numerics in float64: q * scale, k, v rounded to bfloat16; the softmax numerators
    e = exp(s - max) multiply the values rounded to bfloat16 and are summed unrounded."""
    out = np.empty(q.shape)
    q, k, v = rounded(q * np.float32(scale)), rounded(k), rounded(v)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        for head in range(q.shape[1]):
            scores = q[start:end, head] @ k[start:end, head].T
            weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[start:end, head] = rounded(weights) @ v[start:end, head] / weights.sum(axis=-1, keepdims=True)
    return out


@pytest.mark.skipif(not native.has_bf16(), reason=NO_BF16)
@pytest.mark.parametrize(
    ("lengths", "heads", "head_dim"),
    [([7], 1, 16), ([100, 33], 2, 64), ([65, 130], 3, 48), ([20], 1, 128), ([90], 2, 80)],
)
def test_encoder_attention_matches_the_reference(lengths, heads, head_dim):
    """Segments of odd and unpadded lengths; head_dim with 1, 3, 4, 2 x 4 and 4 + 1 vectors of
    output (80: ERNIE-4.5-VL's vision tower)."""
    rng = np.random.default_rng(sum(lengths) + head_dim)
    cu_seqlens = np.cumsum([0, *lengths]).astype(np.int64)
    q, k, v = (rng.standard_normal((cu_seqlens[-1], heads, head_dim)).astype(np.float32) for _ in range(3))
    scale = head_dim**-0.5
    out = native.encoder_attention(q, k, v, cu_seqlens, scale, "avx512", 2, bf16=True)
    # a probability that rounds the other way in float64 moves an output by ~1e-5
    np.testing.assert_allclose(out, attention_reference(q, k, v, cu_seqlens, scale), rtol=0, atol=2e-4)
    float32 = native.encoder_attention(q, k, v, cu_seqlens, scale, "avx512", 2)
    assert np.abs(out - float32).max() > 1e-3  # bfloat16, not the float32 kernel


@pytest.mark.skipif(not native.has_bf16(), reason=NO_BF16)
def test_encoder_attention_qkv_rotates_then_rounds():
    """From a fused projection: q and k rotated in float32 (rotate-half, per-token tables), then the
    bfloat16 numerics of `attention_reference`; bit for bit the rotary op, then the attention."""
    rng = np.random.default_rng(21)
    cu_seqlens, heads, head_dim = np.array([0, 64, 130]), 2, 64
    tokens = cu_seqlens[-1]
    qkv = rng.standard_normal((tokens, 3 * heads * head_dim)).astype(np.float32)
    angles = rng.uniform(0, 20, (tokens, head_dim // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    out = native.encoder_attention_qkv(qkv, cos, sin, cu_seqlens, heads, 0.125, "avx512", 2, bf16=True)
    q, k, v = qkv.reshape(tokens, 3, heads, head_dim).transpose(1, 0, 2, 3)

    def rotated(x):
        c, s, a, b = cos[:, None], sin[:, None], x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    expected = attention_reference(rotated(q), rotated(k), v, cu_seqlens, 0.125)
    # numpy's rotation and the kernel's (fused multiply-adds) differ by float32 ulps, which flip a
    # few bfloat16 roundings: outputs move by up to ~5e-4
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-3)
    positions = np.arange(tokens)
    q, k = (native.rotary_embedding(x, positions, cos, sin, "avx512", 2) for x in (q, k))
    unfused = native.encoder_attention(q, k, v, cu_seqlens, 0.125, "avx512", 2, bf16=True)
    np.testing.assert_array_equal(out, unfused)
    float32 = native.encoder_attention_qkv(qkv, cos, sin, cu_seqlens, heads, 0.125, "avx512", 2)
    assert np.abs(out - float32).max() > 1e-3  # bfloat16, not the float32 kernel


def test_encoder_attention_keeps_float32_where_bf16_cannot_run():
    """AVX2, or a head_dim that is not whole vectors: the float32 kernel, not an error."""
    assert not native.encoder_attention_bf16_runs(64, "avx2")
    assert not native.encoder_attention_bf16_runs(40, "avx512")
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((30, 2, 40)).astype(np.float32) for _ in range(3))
    cu_seqlens = np.array([0, 30])
    np.testing.assert_array_equal(
        native.encoder_attention(q, k, v, cu_seqlens, 0.2, native.best_isa(), 1, bf16=True),
        native.encoder_attention(q, k, v, cu_seqlens, 0.2, native.best_isa(), 1),
    )


def test_the_setting_is_checked_at_construction_and_described(monkeypatch):
    monkeypatch.setenv("FD_CPU_VISION_MATMUL", "fp8")
    with pytest.raises(
        InvalidArgumentError, match="FD_CPU_VISION_MATMUL must be one of float32, bfloat16; got 'fp8'"
    ):
        CpuBackend(BackendOptions(threads=1))
    monkeypatch.setenv("FD_CPU_VISION_MATMUL", "bfloat16")
    assert "vision encoder matmuls in bfloat16" in CpuBackend(BackendOptions(threads=1)).describe()
    report = collect_environment(get_registry())  # what `fastdeploy env` prints
    assert report.env["FD_CPU_VISION_MATMUL"] == "bfloat16"
    cpu = next(status for status in report.backends if status.name == "cpu")
    assert "vision encoder matmuls in bfloat16" in cpu.details
    monkeypatch.setenv("FD_CPU_KERNELS", "numpy")
    with pytest.raises(
        InvalidArgumentError, match="FD_CPU_VISION_MATMUL=bfloat16 needs the cpu backend's native kernels"
    ):
        CpuBackend(BackendOptions(threads=1))
    monkeypatch.delenv("FD_CPU_VISION_MATMUL")
    monkeypatch.delenv("FD_CPU_KERNELS")
    backend = CpuBackend(BackendOptions(threads=1))
    assert "vision encoder matmuls in float32 (exact)" in backend.describe()
    weight = np.ones((4, 8), np.float32)
    assert backend.encoder_linear_weight(weight).type_name == "F32"  # the default stays exact


@pytest.mark.parametrize(
    ("rows", "cols", "depth"), [(32, 32, 32), (45, 40, 64), (300, 100, 96), (640, 48, 1024), (33, 16, 2048)]
)
def test_kind_bf16_products_match_a_float64_product_of_the_rounded_inputs(rows, cols, depth):
    """Prompt-pass sized products of a KIND_BF16 weight through the kernels' common product
    (`gemm`), as the decoder layers pass it: partial panels, several row blocks, deep products."""
    if not native.has_bf16():
        pytest.skip(NO_BF16)
    rng = np.random.default_rng(rows + cols + depth)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    x[:, 1] *= 40.0
    weight = rng.standard_normal((cols, depth)).astype(np.float32)
    bias = rng.standard_normal(cols).astype(np.float32)
    packed = native.pack_bf16([weight])
    assert packed.kind == native._native.KIND_BF16
    out = np.empty((rows, cols), np.float32)
    native._native.gemm(packed.kind, x, packed.packed, out, rows, cols, depth, "avx512", 2, bias)
    expected = rounded(x) @ rounded(weight).T + bias
    bound = 4 * depth * 2.0**-24 * (np.abs(rounded(x)) @ np.abs(rounded(weight)).T + np.abs(bias))
    assert (np.abs(out - expected) <= bound).all()
    exact = x.astype(np.float64) @ weight.astype(np.float64).T + bias
    assert np.abs(out - exact).max() > 100 * np.abs(out - expected).max()


def test_dtype_bfloat16_packs_float_linear_layers_only(monkeypatch):
    """dtype="bfloat16" on the cpu backend: float weights become bfloat16 panels, weights kept in
    GGUF blocks stay so, and the backend says what it multiplies in; without the native kernels it
    is refused, as is any other dtype."""
    if not native.has_bf16():
        pytest.skip(NO_BF16)
    backend = CpuBackend(BackendOptions(threads=1, dtype="bfloat16"))
    assert "float32 with bfloat16 matmuls" in backend.describe()
    rng = np.random.default_rng(5)
    weight, x = (
        rng.standard_normal((48, 64)).astype(np.float32),
        rng.standard_normal((40, 64)).astype(np.float32),
    )
    packed = backend.linear_weight(weight[:16], weight[16:])
    assert packed.type_name == "BF16"
    out = backend.linear(x, packed)
    np.testing.assert_allclose(out, rounded(x) @ rounded(weight).T, rtol=1e-5, atol=1e-4)
    blocks = GGMLTensor(
        int(GGMLQuantizationType.Q8_0), quantize(weight, GGMLQuantizationType.Q8_0), weight.shape
    )
    assert backend.linear_weight(blocks).type_name == "Q8_0"
    assert "float32 with" not in CpuBackend(BackendOptions(threads=1)).describe()
    with pytest.raises(InvalidArgumentError, match="one of: float32, bfloat16"):
        CpuBackend(BackendOptions(dtype="float16"))
    monkeypatch.setenv("FD_CPU_KERNELS", "numpy")
    with pytest.raises(
        InvalidArgumentError, match="dtype='bfloat16' on the cpu backend needs its native kernels"
    ):
        CpuBackend(BackendOptions(threads=1, dtype="bfloat16"))
