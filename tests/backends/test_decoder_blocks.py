"""`Backend.attention_block` and `Backend.mlp_block`, a decoder layer's two halves, and
`Backend.decoder_layers`, a run of whole layers.

The cpu backend runs each half in one native call (decoder_layer.c). It promises the results of
`Backend`'s default, which runs the ops one by one (the path every other backend takes), bit for bit:
both are compared over a sequence of mixed prefill/decode passes, outputs and KV caches. The default
itself is checked against a float64 reference of the layer. A run of layers in one native call
promises the results of the halves called layer by layer (`Backend.decoder_layers`' default).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from kv_reference import cached_values
from test_native_kernels import ISAS, reference_attention, requires_native

from fastdeploy.backends.base import AttentionBlock, Backend, BackendOptions, BatchLayout, MLPBlock
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.backends.cpu.kv_cache import allocate_native
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.model_executor.rope import rope_tables

HIDDEN, HEADS, KV_HEADS, INNER, BLOCK_SIZE, EPS = 128, 4, 2, 96, 4, 1e-5
#: (weights' GGML type or F32, FD_CPU_ACTIVATIONS, biases and per-head q/k norms as Qwen has them)
VARIANTS = {
    "llama-q4_1": ("Q4_1", "float32", False),
    "qwen-f32": ("F32", "float32", True),
    "int8-activations-q8_0": ("Q8_0", "int8", False),
    "int8-activations-q5_0": ("Q5_0", "int8", False),  # a sub-block type (gemm_blocks_int8.c)
}
#: the bit-for-bit comparisons also run the cpu backend's dtype="bfloat16" (float weights packed as
#: bfloat16; the decoder stack rounds a norm's or SiLU's rows for the next product as it computes
#: them, the halves leave it to the product): the same numbers either way
EXACT_VARIANTS = {**VARIANTS, "qwen-bf16-matmuls": ("F32", "float32", True)}
DTYPES = {"qwen-bf16-matmuls": "bfloat16"}
#: passes of two sequences (query tokens of each): prefill chunks, a long chunk (row tasks run on
#: several threads past 32 tokens), then decodes
PASSES = [(6, 3), (1, 4), (40, 1), (1, 1)]


def weight(rng: np.random.Generator, kind: str, rows: int, cols: int) -> np.ndarray | GGMLTensor:
    values = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    if kind == "F32":
        return values
    qtype = GGMLQuantizationType[kind]
    return GGMLTensor(int(qtype), quantize(values, qtype), (rows, cols))


def make_blocks(backend: Backend, kind: str, qwen: bool, head_dim: int, seed: int = 0):
    """(AttentionBlock, MLPBlock, their matrices as float64 [out, in], dequantised)."""
    rng = np.random.default_rng(seed)
    q_size, kv_size = HEADS * head_dim, KV_HEADS * head_dim

    def vector(size: int, around: float = 0.0) -> np.ndarray:
        return (around + 0.1 * rng.standard_normal(size)).astype(np.float32)

    shapes = {"qkv": (q_size + 2 * kv_size, HIDDEN), "o": (HIDDEN, q_size), "gate_up": (2 * INNER, HIDDEN)}
    shapes["down"] = (HIDDEN, INNER)
    drawn = {name: weight(rng, kind, *shape) for name, shape in shapes.items()}
    attention = AttentionBlock(
        input_norm=backend.from_numpy(vector(HIDDEN, 1.0)),
        qkv=backend.linear_weight(drawn["qkv"]),
        o_proj=backend.linear_weight(drawn["o"]),
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=head_dim,
        eps=EPS,
        scale=head_dim**-0.5,
    )
    mlp = MLPBlock(
        norm=backend.from_numpy(vector(HIDDEN, 1.0)),
        gate_up=backend.linear_weight(drawn["gate_up"]),
        down=backend.linear_weight(drawn["down"]),
        eps=EPS,
    )
    if qwen:
        attention.qkv_bias = backend.linear_bias(vector(q_size + 2 * kv_size))
        attention.o_bias = backend.linear_bias(vector(HIDDEN))
        attention.q_norm = backend.from_numpy(vector(head_dim, 1.0))
        attention.k_norm = backend.from_numpy(vector(head_dim, 1.0))
        mlp.gate_up_bias = backend.linear_bias(vector(2 * INNER))
        mlp.down_bias = backend.linear_bias(vector(HIDDEN))
    return attention, mlp, {name: np.asarray(w, np.float64) for name, w in drawn.items()}


def layouts(query_lens: list[tuple[int, int]], table_width: int):
    """BatchLayouts of two sequences whose blocks interleave in the cache (sequence s owns blocks
    s, s + 2, s + 4, ...)."""
    done = [0, 0]
    tables = np.array([[2 * b + s for b in range(table_width)] for s in range(2)], np.int64)
    for lens in query_lens:
        positions = np.concatenate([np.arange(done[s], done[s] + n) for s, n in enumerate(lens)])
        owners = np.repeat([0, 1], lens)
        done = [done[s] + n for s, n in enumerate(lens)]
        yield BatchLayout(
            input_ids=np.zeros(len(positions), np.int64),
            positions=positions,
            slot_mapping=tables[owners, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE,
            query_lens=np.array(lens),
            context_lens=np.array(done),
            block_tables=tables,
            logits_indices=np.array([lens[0] - 1, sum(lens) - 1]),
            block_size=BLOCK_SIZE,
        )


@pytest.fixture(params=ISAS)
def isa(request):
    return request.param


def cpu_backend(monkeypatch, isa: str, activations: str, dtype: str = "float32") -> CpuBackend:
    monkeypatch.setenv("FD_CPU_KERNELS", isa)
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", activations)
    return CpuBackend(BackendOptions(threads=2, dtype=dtype))


@requires_native
@pytest.mark.parametrize("variant", EXACT_VARIANTS)
@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
@pytest.mark.parametrize("head_dim", [64, 40])
def test_native_halves_equal_the_op_by_op_default_bit_for_bit(monkeypatch, isa, variant, kv_dtype, head_dim):
    kind, activations, qwen = EXACT_VARIANTS[variant]
    backend = cpu_backend(monkeypatch, isa, activations, DTYPES.get(variant, "float32"))
    attention, mlp, _ = make_blocks(backend, kind, qwen, head_dim)
    cos, sin = rope_tables(10000.0, head_dim, 64)
    width = -(-max(sum(lens[s] for lens in PASSES) for s in range(2)) // BLOCK_SIZE)
    caches = [allocate_native(2 * width, BLOCK_SIZE, KV_HEADS, head_dim, kv_dtype) for _ in range(2)]
    rng = np.random.default_rng(1)
    for layout in layouts(PASSES, width):
        batch = backend.prepare_batch(layout)
        x = rng.standard_normal((len(layout.positions), HIDDEN)).astype(np.float32)
        residual = rng.standard_normal(x.shape).astype(np.float32)
        for given in (None, residual):
            fused = backend.attention_block(x, given, attention, layout.positions, cos, sin, batch, caches[0])
            default = Backend.attention_block(
                backend, x, given, attention, layout.positions, cos, sin, batch, caches[1]
            )
            for ours, theirs in zip(fused, default, strict=True):
                np.testing.assert_array_equal(ours, theirs)
            fused = backend.mlp_block(x, given, mlp)
            for ours, theirs in zip(fused, Backend.mlp_block(backend, x, given, mlp), strict=True):
                np.testing.assert_array_equal(ours, theirs)
    for ours, theirs in zip(*caches, strict=True):
        np.testing.assert_array_equal(ours, theirs)


@requires_native
@pytest.mark.parametrize("variant", EXACT_VARIANTS)
def test_a_run_of_layers_in_one_call_equals_the_halves_layer_by_layer_bit_for_bit(monkeypatch, isa, variant):
    """Three layers of different weights over mixed passes, with and without an incoming residual;
    a pass on other caches (as the engine's fault probe makes) in between must not disturb either."""
    kind, activations, qwen = EXACT_VARIANTS[variant]
    backend = cpu_backend(monkeypatch, isa, activations, DTYPES.get(variant, "float32"))
    if variant in DTYPES:
        assert layers_kind(backend) == "BF16"
    layers = [make_blocks(backend, kind, qwen, 64, seed=seed)[:2] for seed in range(3)]
    cos, sin = rope_tables(10000.0, 64, 64)
    width = -(-max(sum(lens[s] for lens in PASSES) for s in range(2)) // BLOCK_SIZE)

    def caches() -> list:
        return [allocate_native(2 * width, BLOCK_SIZE, KV_HEADS, 64, "float32") for _ in layers]

    ours_caches, default_caches, probe_caches = caches(), caches(), caches()
    rng = np.random.default_rng(2)
    for layout in layouts(PASSES, width):
        batch = backend.prepare_batch(layout)
        x = rng.standard_normal((len(layout.positions), HIDDEN)).astype(np.float32)
        residual = rng.standard_normal(x.shape).astype(np.float32)
        for given in (None, residual):
            args = (layout.positions, cos, sin, batch)
            ours = backend.decoder_layers(x, given, layers, *args, ours_caches)
            backend.decoder_layers(x, given, layers, *args, probe_caches)
            default = Backend.decoder_layers(backend, x, given, layers, *args, default_caches)
            for mine, theirs in zip(ours, default, strict=True):
                np.testing.assert_array_equal(mine, theirs)
    for mine, theirs in zip(ours_caches, default_caches, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            np.testing.assert_array_equal(a, b)


@requires_native
def test_a_run_of_layers_of_different_widths_is_refused_naming_the_layer(monkeypatch):
    backend = cpu_backend(monkeypatch, native.best_isa(), "float32")
    attention, mlp, _ = make_blocks(backend, "Q4_1", False, 64)
    wide = np.zeros((2 * INNER, 2 * HIDDEN), np.float32)
    wide_mlp = MLPBlock(
        norm=backend.from_numpy(np.ones(2 * HIDDEN, np.float32)),
        gate_up=backend.linear_weight(wide),
        down=backend.linear_weight(np.zeros((2 * HIDDEN, INNER), np.float32)),
        eps=EPS,
    )
    cache = allocate_native(2, BLOCK_SIZE, KV_HEADS, 64, "float32")
    expected = f"layer 1's attention half is {HIDDEN} wide and its MLP half {2 * HIDDEN}"
    with pytest.raises(ValueError, match=expected):
        native.prepare_decoder_stack([(attention, mlp), (attention, wide_mlp)], [cache, cache])


def rms_norm64(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS) * weight


def layers_kind(backend: CpuBackend) -> str:
    """The packed type the backend gives a float linear weight."""
    return backend.linear_weight(np.zeros((32, 32), np.float32)).type_name


def rotate64(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = cos.shape[-1]
    first, second = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :].astype(np.float64), sin[:, None, :].astype(np.float64)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


@requires_native
@pytest.mark.parametrize("variant", VARIANTS)
def test_layer_matches_a_float64_reference(monkeypatch, isa, variant):
    """One sequence's prefill then a decode through both halves, against float64 arithmetic on the
    dequantised weights (int8 activations round each block of an activation row: looser)."""
    kind, activations, qwen = VARIANTS[variant]
    backend = cpu_backend(monkeypatch, isa, activations)
    head_dim = 64
    attention, mlp, dense = make_blocks(backend, kind, qwen, head_dim)
    rng = np.random.default_rng(2)
    cos, sin = rope_tables(10000.0, head_dim, 16)
    cache = allocate_native(4, BLOCK_SIZE, KV_HEADS, head_dim, "float32")
    x = rng.standard_normal((9, HIDDEN)).astype(np.float32)
    q_size, kv_size = HEADS * head_dim, KV_HEADS * head_dim
    tolerance = 2e-2 if activations == "int8" else 2e-4
    keys, values = [], []
    for start, end in ((0, 8), (8, 9)):
        positions = np.arange(start, end)
        layout = BatchLayout(
            input_ids=np.zeros(end - start, np.int64),
            positions=positions,
            slot_mapping=positions,
            query_lens=np.array([end - start]),
            context_lens=np.array([end]),
            block_tables=np.arange(4)[None, :],
            logits_indices=np.array([end - start - 1]),
            block_size=BLOCK_SIZE,
        )
        out, _ = backend.attention_block(
            x[start:end], None, attention, positions, cos, sin, backend.prepare_batch(layout), cache
        )
        qkv = rms_norm64(x[start:end], attention.input_norm) @ dense["qkv"].T
        if qwen:
            qkv += attention.qkv_bias
        q = qkv[:, :q_size].reshape(-1, HEADS, head_dim)
        k = qkv[:, q_size : q_size + kv_size].reshape(-1, KV_HEADS, head_dim)
        if qwen:
            q, k = rms_norm64(q, attention.q_norm), rms_norm64(k, attention.k_norm)
        keys.append(rotate64(k, cos[positions], sin[positions]))
        values.append(qkv[:, q_size + kv_size :].reshape(-1, KV_HEADS, head_dim))
        attended = reference_attention(
            rotate64(q, cos[positions], sin[positions]),
            cached_values(np.concatenate(keys), "float32"),
            cached_values(np.concatenate(values), "float32"),
            head_dim**-0.5,
        )
        expected = attended.reshape(end - start, q_size) @ dense["o"].T + (attention.o_bias if qwen else 0)
        np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())
    out, total = backend.mlp_block(x, x, mlp)  # with a residual: the block normalises x + x
    np.testing.assert_array_equal(total, x + x)
    up = rms_norm64(x + x, mlp.norm) @ dense["gate_up"].T + (mlp.gate_up_bias if qwen else 0)
    gate, up = up[:, :INNER], up[:, INNER:]
    expected = (gate / (1 + np.exp(-gate)) * up) @ dense["down"].T + (mlp.down_bias if qwen else 0)
    np.testing.assert_allclose(out, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())


@requires_native
def test_mismatched_weights_are_refused_with_the_block_named(monkeypatch):
    backend = cpu_backend(monkeypatch, native.best_isa(), "float32")
    attention, mlp, _ = make_blocks(backend, "Q4_1", False, 64)
    wrong = make_blocks(backend, "Q4_1", False, 64)[1]
    mlp.down = wrong.gate_up  # [2 * INNER, HIDDEN] where [HIDDEN, INNER] belongs
    x = np.zeros((1, HIDDEN), np.float32)
    with pytest.raises(ValueError, match="mlp_block down"):
        backend.mlp_block(x, None, mlp)
    attention.o_proj = wrong.down
    layout = next(layouts([(1, 1)], 1))
    cache = allocate_native(2, BLOCK_SIZE, KV_HEADS, 64, "float32")
    cos, sin = rope_tables(10000.0, 64, 8)
    with pytest.raises(ValueError, match="attention_block o_proj"):
        backend.attention_block(
            np.zeros((2, HIDDEN), np.float32),
            None,
            attention,
            layout.positions,
            cos,
            sin,
            backend.prepare_batch(layout),
            cache,
        )
