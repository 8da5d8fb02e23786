"""The cpu backend's native kernels against `gguf`'s dequantisation and float64 numpy references.

The matmul kernels promise float32 weights bit-identical to `gguf.quants.dequantize`: multiplying
by an identity matrix must reproduce them exactly. Both instruction sets are exercised where the
CPU has them (AVX2 code runs on AVX-512 machines too).
"""

from __future__ import annotations

import math
import platform
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from kv_reference import KV_DTYPES, cached_values, one_sequence_layout

from fastdeploy.backends.base import BackendOptions, BatchLayout
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.backends.cpu.kv_cache import allocate_native
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.model_executor.rope import interleaved_to_half_rows

X86_LINUX = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
requires_native = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"native kernels: {native.unavailable_reason()}"
)


def runs_here(isa: str) -> bool:
    """Whether this CPU runs the kernels compiled for `isa` (ISAS lists the widest first)."""
    best = native.best_isa()
    return best in native.ISAS and native.ISAS.index(isa) >= native.ISAS.index(best)


ISAS = [
    pytest.param(isa, marks=pytest.mark.skipif(not runs_here(isa), reason=f"no {isa} here"))
    for isa in native.ISAS
]
TYPES = ["Q4_1", "Q8_0"]


def ggml_matrix(type_name: str, rows: int, cols: int, seed: int = 0) -> GGMLTensor:
    weights = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    qtype = GGMLQuantizationType[type_name]
    return GGMLTensor(int(qtype), quantize(weights, qtype), (rows, cols))


def reference_dequantized(tensor: GGMLTensor) -> np.ndarray:
    return dequantize(tensor.rows, GGMLQuantizationType(tensor.ggml_type))


@pytest.mark.skipif(not X86_LINUX, reason="the extension is built on x86-64 Linux only")
def test_extension_is_built_here():
    """A silently failed build would leave only the numpy path; on x86-64 Linux that is a bug."""
    assert native.unavailable_reason() is None


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize(("rows", "cols"), [(40, 64), (16, 96), (3, 32)])
def test_identity_input_reproduces_gguf_dequantisation_exactly(isa, type_name, rows, cols):
    tensor = ggml_matrix(type_name, rows, cols)
    packed = native.pack([tensor])
    out = native.matmul(np.eye(cols, dtype=np.float32), packed, isa, threads=2)
    np.testing.assert_array_equal(out, reference_dequantized(tensor).T)


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("tokens", [1, 5, 16, 17, 40])
def test_matmul_matches_float64_reference(isa, type_name, tokens):
    tensor = ggml_matrix(type_name, 72, 128, seed=tokens)
    x = np.random.default_rng(tokens).standard_normal((tokens, 128)).astype(np.float32)
    out = native.matmul(x, native.pack([tensor]), isa, threads=2)
    expected = x.astype(np.float64) @ reference_dequantized(tensor).T.astype(np.float64)
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", TYPES)
def test_many_rows_path_equals_few_rows_path_bit_for_bit(isa, type_name):
    """Past one row tile the panel is dequantised into a buffer first; the sums must not change."""
    tensor = ggml_matrix(type_name, 48, 256)
    packed = native.pack([tensor])
    x = np.random.default_rng(1).standard_normal((50, 256)).astype(np.float32)
    together = native.matmul(x, packed, isa, threads=2)
    one_by_one = np.concatenate([native.matmul(row[None], packed, isa, threads=1) for row in x])
    np.testing.assert_array_equal(together, one_by_one)


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", range(1, 18))
def test_few_rows_tiles_equal_the_many_rows_path_bit_for_bit(isa, type_name, rows):
    """One Q4_1 row goes through four panels at once, few rows through both panels of a pair (up to
    4 rows with AVX-512, 2 with AVX2), more rows one panel at a time in tiles of 8 (AVX-512) or 4
    (AVX2); every row count must give the sums of the dequantised buffer path. 90 columns: four full
    panels, then a pair whose second panel is partial (10 columns)."""
    tensor = ggml_matrix(type_name, 90, 192, seed=rows)
    packed = native.pack([tensor])
    x = np.random.default_rng(rows).standard_normal((4 * rows, 192)).astype(np.float32)
    padded = np.concatenate([x, np.zeros((17, 192), np.float32)])  # past one tile of the few-rows kernels
    many_rows = native.matmul(padded, packed, isa, threads=2)[: 4 * rows]
    tiles = np.concatenate(
        [native.matmul(x[i : i + rows], packed, isa, threads=2) for i in range(0, 4 * rows, rows)]
    )
    np.testing.assert_array_equal(tiles, many_rows)
    expected = x.astype(np.float64) @ reference_dequantized(tensor).T.astype(np.float64)
    np.testing.assert_allclose(tiles, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


@requires_native
def test_fused_parts_pack_like_their_stacked_rows():
    q, k = ggml_matrix("Q4_1", 32, 64, 1), ggml_matrix("Q4_1", 16, 64, 2)
    fused = native.pack([q, k])
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    out = native.matmul(x, fused, native.best_isa(), threads=1)
    expected = x.astype(np.float64) @ np.concatenate([reference_dequantized(q), reference_dequantized(k)]).T
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("sizes", [(5, 70, 33), (32, 64), (1,), (31, 2)])
def test_float32_parts_are_packed_in_the_kernels_panel_pairs(sizes):
    """Layout of gemm.c's float buffer: [pairs][in][32], row r of the stacked parts in pair
    r // 32, column r % 32, zeros past the last row (the memory comes uninitialised)."""
    rng = np.random.default_rng(len(sizes))
    parts = [rng.standard_normal((n, 24)).astype(np.float32) for n in sizes]
    garbage = lambda nbytes: np.full(nbytes, 0xFF, np.uint8)  # noqa: E731 - NaN unless written
    packed = native._pack_f32(parts, garbage)
    stacked = np.concatenate(parts)
    pairs = -(-len(stacked) // 32)
    expected = np.zeros((pairs * 32, 24), np.float32)
    expected[: len(stacked)] = stacked
    expected = np.stack([expected[32 * p : 32 * p + 32].T for p in range(pairs)])
    np.testing.assert_array_equal(packed, expected)


@requires_native
@pytest.mark.parametrize(
    "parts",
    [
        [ggml_matrix("TQ2_0", 16, 256)],  # a block type without a kernel (MXFP4 has one now)
        [np.random.default_rng(4).standard_normal((40, 64)).astype(np.float16)],
    ],
    ids=["tq2_0", "float16"],
)
def test_parts_without_a_block_kernel_are_packed_as_float32(parts):
    packed = native.pack(parts)
    assert packed.type_name == "F32"
    dense = np.concatenate([np.asarray(part, np.float32) for part in parts])
    x = np.random.default_rng(5).standard_normal((3, dense.shape[1])).astype(np.float32)
    expected = x.astype(np.float64) @ dense.T.astype(np.float64)
    np.testing.assert_allclose(
        native.matmul(x, packed, native.best_isa(), threads=2), expected, rtol=2e-5, atol=1e-4
    )


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("rows", "depth"), [(40, 50), (70, 33), (32, 7)])
@pytest.mark.parametrize("tokens", [1, 16, 29, 1030])
def test_float32_weights_any_shape(isa, rows, depth, tokens):
    """Float weights need no block-aligned depth; columns are padded to whole panel pairs; row counts
    from one to a vision encoder's (1030: many full row tiles, AVX-512's 12 or AVX2's 6, and a partial one)."""
    rng = np.random.default_rng(rows + depth + tokens)
    weight = rng.standard_normal((rows, depth)).astype(np.float32)
    packed = native.pack([weight])
    identity = native.matmul(np.eye(depth, dtype=np.float32), packed, isa, threads=2)
    np.testing.assert_array_equal(identity, weight.T)
    x = rng.standard_normal((tokens, depth)).astype(np.float32)
    expected = x.astype(np.float64) @ weight.T.astype(np.float64)
    np.testing.assert_allclose(native.matmul(x, packed, isa, threads=2), expected, rtol=2e-5, atol=1e-4)


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("weights", ["F32", "Q8_0", "Q4_1", "Q8_0 int8"])
@pytest.mark.parametrize("tokens", [1, 13, 40])
def test_bias_is_added_as_each_tile_is_stored(isa, weights, tokens):
    """Every kernel family (float panels, blocks for few and many rows, int8 activations) adds the
    bias to each row, including the columns of a last, partly filled panel (cols 45)."""
    type_name, _, activations = weights.partition(" ")
    rng = np.random.default_rng(tokens)
    if type_name == "F32":
        matrix = rng.standard_normal((45, 64)).astype(np.float32)
        packed = native.pack([matrix])
    else:
        tensor = ggml_matrix(type_name, 45, 64, seed=tokens)
        matrix = reference_dequantized(tensor)
        packed = native.pack([tensor], activations=activations or "float32")
    x = rng.standard_normal((tokens, 64)).astype(np.float32)
    bias = rng.standard_normal(45).astype(np.float32) * 10
    with_bias = native.matmul(x, packed, isa, threads=2, bias=bias)
    without = native.matmul(x, packed, isa, threads=2)
    np.testing.assert_allclose(with_bias, without.astype(np.float64) + bias, rtol=1e-6, atol=1e-5)
    if not activations:  # int8 activations are checked against float references in test_native_int8
        expected = x.astype(np.float64) @ matrix.T.astype(np.float64) + bias
        np.testing.assert_allclose(with_bias, expected, rtol=2e-5, atol=1e-4)
    with pytest.raises(ValueError, match="bias has 176 bytes, expected cols=45"):
        native.matmul(x, packed, isa, threads=1, bias=bias[:44])


def test_parts_must_share_their_input_size():
    with pytest.raises(ValueError, match="one `in`"):
        native.pack([np.ones((16, 64), np.float32), np.ones((16, 32), np.float32)])


@requires_native
def test_bad_shapes_are_refused_by_the_extension():
    packed = native.pack([ggml_matrix("Q8_0", 16, 64)])
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="buffer sizes"):
        native._native.gemm(1, x, packed.packed, np.empty((2, 8), np.float32), 2, 16, 64, "avx2", 1)
    with pytest.raises(ValueError, match="multiple of 32"):
        native._native.gemm(1, x, packed.packed, np.empty((2, 16), np.float32), 2, 16, 60, "avx2", 1)


def test_ggml_tensor_rows_move_whole():
    """Undoing llama.cpp's q/k permutation on blocks equals doing it on the dequantised matrix."""
    tensor = ggml_matrix("Q4_1", 24, 64)
    dense = reference_dequantized(tensor)
    np.testing.assert_array_equal(np.asarray(tensor), dense)
    np.testing.assert_array_equal(
        np.asarray(interleaved_to_half_rows(tensor, num_heads=3)),
        interleaved_to_half_rows(dense, num_heads=3),
    )


def test_unknown_kernel_choice_names_the_variable(monkeypatch):
    monkeypatch.setenv("FD_CPU_KERNELS", "avx9000")
    with pytest.raises(InvalidArgumentError, match="FD_CPU_KERNELS must be one of auto, avx512, avx2, numpy"):
        CpuBackend(BackendOptions())


@pytest.mark.parametrize("kernels", ["numpy", pytest.param("auto", marks=requires_native)])
def test_backend_uses_the_kernels_asked_for(monkeypatch, kernels):
    monkeypatch.setenv("FD_CPU_KERNELS", kernels)
    backend = CpuBackend(BackendOptions(threads=1))
    weight = backend.linear_weight(ggml_matrix("Q8_0", 16, 64))
    assert isinstance(weight, native.PackedWeight) == (kernels == "auto")
    assert ("native" in backend.describe()) == (kernels == "auto")


def reference_attention(q, keys, values, scale):
    """Causal attention of the last len(q) of len(keys) positions, in float64."""
    length, heads, _ = q.shape
    context, kv_heads, _ = keys.shape
    out = np.empty(q.shape)
    for t in range(length):
        visible = context - length + t + 1
        for h in range(heads):
            kh = h // (heads // kv_heads)
            scores = keys[:visible, kh].astype(np.float64) @ q[t, h] * scale
            weights = np.exp(scores - scores.max())
            out[t, h] = (weights / weights.sum()) @ values[:visible, kh]
    return out


@pytest.fixture(params=ISAS)
def backend_for_isa(request, monkeypatch):
    """A cpu backend whose every native kernel runs the given instruction set."""
    monkeypatch.setenv("FD_CPU_KERNELS", request.param)
    backend = CpuBackend(BackendOptions(threads=2))
    assert backend.native_isa == request.param
    return backend


@requires_native
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize(
    ("block_size", "head_dim", "heads", "kv_heads"),
    [(64, 64, 9, 3), (128, 128, 4, 4), (16, 96, 8, 2), (4, 8, 4, 2)],
)
def test_attention_over_scattered_blocks(backend_for_isa, block_size, head_dim, heads, kv_heads, kv_dtype):
    """A long prefill in two chunks (more than one query tile and score chunk), then decodes; the
    reference attends over the values the cache's element type holds (see `cached_values`)."""
    rng = np.random.default_rng(block_size + head_dim)
    backend = backend_for_isa
    context = 150
    blocks = -(-(context + 2) // block_size)
    table = rng.permutation(blocks + 5)[:blocks]
    cache = allocate_native(blocks + 5, block_size, kv_heads, head_dim, kv_dtype)
    keys = rng.standard_normal((context + 2, kv_heads, head_dim)).astype(np.float32)
    values = rng.standard_normal((context + 2, kv_heads, head_dim)).astype(np.float32)
    queries = rng.standard_normal((context + 2, heads, head_dim)).astype(np.float32)
    scale = head_dim**-0.5
    for start, end in [(0, 70), (70, context), (context, context + 1), (context + 1, context + 2)]:
        layout = one_sequence_layout(table, start, end, block_size)
        out = backend.attention(
            queries[start:end],
            keys[start:end],
            values[start:end],
            cache,
            backend.prepare_batch(layout),
            scale,
        )
        expected = reference_attention(
            queries[start:end],
            cached_values(keys[:end], kv_dtype),
            cached_values(values[:end], kv_dtype),
            scale,
        )
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def ragged_layout(tables: np.ndarray, spans: list[tuple[int, int]], block_size: int) -> BatchLayout:
    """One pass of several sequences: sequence i computes positions spans[i][0]..spans[i][1]-1 over
    block table tables[i]."""
    positions = np.concatenate([np.arange(start, end) for start, end in spans])
    owner = np.repeat(np.arange(len(spans)), [end - start for start, end in spans])
    return BatchLayout(
        input_ids=np.zeros(len(positions), np.int64),
        positions=positions,
        slot_mapping=tables[owner, positions // block_size] * block_size + positions % block_size,
        query_lens=np.array([end - start for start, end in spans]),
        context_lens=np.array([end for _, end in spans]),
        block_tables=tables,
        logits_indices=np.cumsum([end - start for start, end in spans]) - 1,
        block_size=block_size,
    )


@requires_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("window", [0, 45])
def test_attention_of_a_ragged_batch_is_the_same_on_any_thread_count(monkeypatch, isa, window):
    """Prefills of several lengths, one after a cached prefix, and a decode row in one pass: the
    threads claim each sequence's query tiles last to first (attention.c), not in token order;
    every row must still equal the float64 reference, bit for bit on 1, 2 and 3 threads."""
    monkeypatch.setenv("FD_CPU_KERNELS", isa)
    block_size, heads, kv_heads, head_dim = 16, 8, 2, 64
    spans = [(0, 97), (40, 75), (120, 121), (0, 33)]  # the second and third after cached positions
    rng = np.random.default_rng(7)
    width = -(-max(end for _, end in spans) // block_size)
    tables = rng.permutation(len(spans) * width).reshape(len(spans), width)
    layout = ragged_layout(tables, spans, block_size)
    contexts = [
        {
            name: rng.standard_normal((end, kv_heads if name != "q" else heads, head_dim)).astype(np.float32)
            for name in ("q", "k", "v")
        }
        for _, end in spans
    ]
    scale = head_dim**-0.5
    outputs = []
    for threads in (1, 2, 3):
        backend = CpuBackend(BackendOptions(threads=threads))
        cache = allocate_native(len(spans) * width, block_size, kv_heads, head_dim, "float32")

        def attend(q, k, v, layout, backend=backend, cache=cache):
            if window:
                return backend.windowed_attention(
                    q, k, v, cache, backend.prepare_batch(layout), scale, window
                )
            return backend.attention(q, k, v, cache, backend.prepare_batch(layout), scale)

        for i, (start, _) in enumerate(spans):  # the cached positions, written by an earlier pass
            if start:
                prefix = ragged_layout(tables[i : i + 1], [(0, start)], block_size)
                attend(contexts[i]["q"][:start], contexts[i]["k"][:start], contexts[i]["v"][:start], prefix)
        rows = {
            name: np.concatenate([c[name][start:] for c, (start, _) in zip(contexts, spans, strict=True)])
            for name in "qkv"
        }
        outputs.append(attend(rows["q"], rows["k"], rows["v"], layout))
    expected = np.concatenate(
        [
            windowed_reference(c["q"][start:], c["k"], c["v"], scale, window)
            for c, (start, _) in zip(contexts, spans, strict=True)
        ]
    )
    np.testing.assert_allclose(outputs[0], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(outputs[1], outputs[0])
    np.testing.assert_array_equal(outputs[2], outputs[0])


def windowed_reference(q, keys, values, scale, window):
    """reference_attention where each query sees only its last `window` positions (0: all)."""
    if not window:
        return reference_attention(q, keys, values, scale)
    context = len(keys)
    out = np.empty(q.shape)
    for t in range(len(q)):
        end = context - len(q) + t + 1
        start = max(0, end - window)
        out[t] = reference_attention(q[t : t + 1], keys[start:end], values[start:end], scale)[0]
    return out


@requires_native
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize(("block_size", "head_dim", "heads", "kv_heads"), [(16, 64, 8, 2), (4, 8, 3, 1)])
def test_attention_with_sinks_over_scattered_blocks(
    backend_for_isa, block_size, head_dim, heads, kv_heads, kv_dtype, window
):
    """The native attention times the native sink factors (attention_sinks.c), against numpy's
    attention with sinks over the values the cache holds: a prefill in two chunks (more than one
    tile of query tokens), then decodes; sinks from far below to far above the scores, with and
    without a sliding window."""
    rng = np.random.default_rng(block_size + head_dim + window)
    backend = backend_for_isa
    context = 100
    blocks = -(-(context + 2) // block_size)
    table = rng.permutation(blocks + 5)[:blocks]
    cache = allocate_native(blocks + 5, block_size, kv_heads, head_dim, kv_dtype)
    keys, values = (rng.standard_normal((context + 2, kv_heads, head_dim)).astype(np.float32) for _ in "kv")
    queries = rng.standard_normal((context + 2, heads, head_dim)).astype(np.float32)
    sinks = np.linspace(-6.0, 6.0, heads).astype(np.float32)
    scale = head_dim**-0.5
    for start, end in [(0, 45), (45, context), (context, context + 1), (context + 1, context + 2)]:
        layout = one_sequence_layout(table, start, end, block_size)
        out = backend.attention_with_sinks(
            queries[start:end],
            keys[start:end],
            values[start:end],
            cache,
            backend.prepare_batch(layout),
            scale,
            sinks,
            window,
        )
        expected = ref.causal_attention(
            queries[start:end],
            cached_values(keys[:end], kv_dtype),
            cached_values(values[:end], kv_dtype),
            scale,
            sinks,
            window,
        )
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


@requires_native
def test_sink_factors_reject_a_block_table_outside_the_cache():
    cache = allocate_native(2, 4, 1, 8, "float32")
    batch = native.attention_batch(
        BatchLayout(
            input_ids=np.zeros(1, np.int64),
            positions=np.array([0]),
            slot_mapping=np.array([0]),
            query_lens=np.array([1]),
            context_lens=np.array([1]),
            block_tables=np.array([[7]]),
            logits_indices=np.array([0]),
            block_size=4,
        )
    )
    q = np.zeros((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match="block_tables"):
        native.attention_sink_factors(q, cache, batch, 1.0, np.zeros(1, np.float32), 1)


@requires_native
def test_attention_rejects_a_block_table_outside_the_cache():
    backend = CpuBackend(BackendOptions(threads=1))
    cache = allocate_native(2, 4, 1, 8, "float32")
    layout = BatchLayout(
        input_ids=np.zeros(1, np.int64),
        positions=np.array([0]),
        slot_mapping=np.array([0]),
        query_lens=np.array([1]),
        context_lens=np.array([1]),
        block_tables=np.array([[7]]),
        logits_indices=np.array([0]),
        block_size=4,
    )
    q = np.zeros((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match="block_tables"):
        backend.attention(q, q, q, cache, backend.prepare_batch(layout), 1.0)


def test_without_the_extension_auto_falls_back_and_explicit_choices_fail(monkeypatch):
    monkeypatch.setattr(native, "_native", None)
    monkeypatch.setattr(native, "_IMPORT_ERROR", "the native extension is not built (simulated)")
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    backend = CpuBackend(BackendOptions(threads=1))
    assert backend.native_isa is None and "numpy" in backend.describe()
    assert isinstance(backend.linear_weight(ggml_matrix("Q4_1", 16, 64)), np.ndarray)
    monkeypatch.setenv("FD_CPU_KERNELS", "avx2")
    with pytest.raises(
        InvalidArgumentError, match="FD_CPU_KERNELS=avx2 cannot run: the native extension is not built"
    ):
        CpuBackend(BackendOptions(threads=1))


def test_a_missing_extension_names_the_python_and_the_build_command(monkeypatch):
    """What `fastdeploy env` shows on a machine whose Python has no build of the extension."""

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(native.importlib, "import_module", missing)
    module, reason = native._import_extension()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert module is None
    assert reason.startswith(f"the native extension is not built for this Python ({version})")
    assert "python setup.py build_ext --inplace" in reason and "circular" not in reason


@requires_native
def test_element_wise_ops_on_each_instruction_set(backend_for_isa):
    """RMSNorm (+ residual), SiLU-and-mul and rotary against float64 numpy, rows both below and
    above the counts at which the kernels split rows over threads."""
    backend = backend_for_isa
    rng = np.random.default_rng(7)
    for rows in (3, 100):
        x, residual = rng.standard_normal((2, rows, 96)).astype(np.float32)
        weight = rng.standard_normal(96).astype(np.float32)
        normed, total = backend.rms_norm(x, weight, 1e-6, residual)
        expected_total = x.astype(np.float64) + residual
        rms = np.sqrt((expected_total**2).mean(axis=-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(total, expected_total, rtol=1e-6)
        np.testing.assert_allclose(normed, expected_total / rms * weight, rtol=1e-5, atol=1e-5)

        gate_up = rng.standard_normal((rows, 2 * 80)).astype(np.float32) * 8
        gate, up = gate_up[:, :80].astype(np.float64), gate_up[:, 80:]
        np.testing.assert_allclose(
            backend.silu_and_mul(gate_up), gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-6
        )

        q = rng.standard_normal((rows, 3, 64)).astype(np.float32)
        positions = rng.integers(0, 50, rows)
        inv_freq = 1.0 / 10000 ** (np.arange(0, 48, 2) / 48)  # partial rotary: 48 of 64 columns
        angles = np.outer(np.arange(50), inv_freq)
        out = backend.rotary_embedding(
            q, positions, np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        )
        cos, sin = np.cos(angles[positions])[:, None], np.sin(angles[positions])[:, None]
        first, second = q[..., :24].astype(np.float64), q[..., 24:48]
        np.testing.assert_allclose(out[..., :24], first * cos - second * sin, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out[..., 24:48], second * cos + first * sin, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out[..., 48:], q[..., 48:])


@requires_native
def test_vision_element_wise_ops_on_each_instruction_set(backend_for_isa):
    """LayerNorm (with and without residual and bias), quick GELU and exact GELU against float64
    references (math.erf), on a row width that is no multiple of a vector and rows both below and
    above the counts at which the kernels split rows over threads."""
    backend = backend_for_isa
    rng = np.random.default_rng(8)
    for rows in (3, 100):
        x, residual = (rng.standard_normal((2, rows, 203)) * 4 + 1).astype(np.float32)
        weight, bias = rng.standard_normal((2, 203)).astype(np.float32)
        for with_residual, with_bias in ((True, True), (False, True), (False, False)):
            normed, total = backend.layer_norm(
                x, weight, bias if with_bias else None, 1e-5, residual if with_residual else None
            )
            expected_total = x.astype(np.float64) + (residual if with_residual else 0)
            centred = expected_total - expected_total.mean(axis=-1, keepdims=True)
            expected = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + 1e-5) * weight
            if with_bias:
                expected += bias
            np.testing.assert_allclose(total, expected_total, rtol=1e-6)
            np.testing.assert_allclose(normed, expected, rtol=1e-5, atol=1e-5)

        h = x.astype(np.float64)
        h[0, :6] = [0.0, -0.0, 60.0, -60.0, 1e-7, -3.0]
        wide = h.astype(np.float32)
        np.testing.assert_allclose(
            backend.quick_gelu(wide), h / (1 + np.exp(-1.702 * h)), rtol=1e-6, atol=1e-6
        )
        erf = np.vectorize(math.erf)(h / math.sqrt(2.0))
        np.testing.assert_allclose(backend.gelu(wide), 0.5 * h * (1 + erf), rtol=1e-6, atol=1e-6)


@requires_native
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(64, 64), (40, 40), (64, 32)])
def test_encoder_attention_qkv_rotates_as_it_lays_out(backend_for_isa, head_dim, rotary_dim):
    """From one fused projection (q, k, v read in place at their offsets), q and k rotated by
    per-token tables (full and partial rotary), against float64 rotation and attention."""
    from fastdeploy.backends.conformance import numpy_reference as ref

    rng = np.random.default_rng(head_dim + rotary_dim)
    bounds = [0, 5, 60, 113]
    tokens, heads = bounds[-1], 3
    qkv = rng.standard_normal((tokens, 3 * heads * head_dim)).astype(np.float32)
    positions = rng.integers(0, 50, tokens)
    inv_freq = 1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = np.outer(positions, inv_freq)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    out = backend_for_isa.encoder_attention_qkv(qkv, cos, sin, np.array(bounds), heads, 0.3)
    q, k, v = qkv.reshape(tokens, 3, heads, head_dim).transpose(1, 0, 2, 3)
    q, k = ref.rotary(q, positions, inv_freq), ref.rotary(k, positions, inv_freq)
    expected = ref.segment_attention(q, k, v, bounds, 0.3).reshape(tokens, heads * head_dim)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cos/sin are not"):
        backend_for_isa.encoder_attention_qkv(qkv, cos[:-1], sin[:-1], np.array(bounds), heads, 0.3)
    with pytest.raises(ValueError, match="qkv's width"):
        backend_for_isa.encoder_attention_qkv(qkv[:, :-1], cos, sin, np.array(bounds), heads, 0.3)


@requires_native
@pytest.mark.parametrize("head_dim", [64, 40])
def test_encoder_attention_covers_every_row_group(backend_for_isa, head_dim):
    """Segments of 1-6 tokens and of 48 + 1..6 (a work item is 48 query rows, taken up to 6 at a time):
    every partial group of rows the kernels have a case for, on the head_dim-64 and any-head_dim paths."""
    from fastdeploy.backends.conformance.numpy_reference import segment_attention

    lengths = [1, 2, 3, 4, 5, 6, 49, 50, 51, 52, 53, 54]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    rng = np.random.default_rng(head_dim)
    q, k, v = (rng.standard_normal((bounds[-1], 2, head_dim)).astype(np.float32) * 2 for _ in range(3))
    out = backend_for_isa.encoder_attention(q, k, v, bounds, 0.2)
    np.testing.assert_allclose(out, segment_attention(q, k, v, list(bounds), 0.2), rtol=1e-5, atol=1e-5)
