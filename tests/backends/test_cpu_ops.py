"""cpu backend ops against straightforward per-head, per-token numpy references."""

import numpy as np
import pytest
from kv_reference import KV_DTYPES, cached_values

from fastdeploy.backends.base import BackendOptions, BatchLayout, KVCacheSpec
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.errors import InvalidArgumentError


@pytest.fixture(scope="module", params=["auto", "numpy"])
def backend(request) -> CpuBackend:
    """The backend with its native kernels (where built) and with numpy only."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FD_CPU_KERNELS", request.param)
        return CpuBackend(BackendOptions(threads=1))


def reference_attention(q, keys, values, scale):
    """Causal attention of the last len(q) positions over all keys, one head and token at a time."""
    length, heads, _ = q.shape
    context, kv_heads, _ = keys.shape
    group = heads // kv_heads
    out = np.zeros_like(q, dtype=np.float64)
    for t in range(length):
        position = context - length + t
        for h in range(heads):
            kh = h // group
            scores = np.array([q[t, h] @ keys[j, kh] * scale for j in range(position + 1)])
            weights = np.exp(scores - scores.max())
            weights /= weights.sum()
            out[t, h] = sum(weights[j] * values[j, kh] for j in range(position + 1))
    return out


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_paged_attention_matches_dense_causal_attention(backend, kv_dtype):
    rng = np.random.default_rng(0)
    heads, kv_heads, dim, block = 4, 2, 8, 4
    spec = KVCacheSpec(
        num_layers=1, num_blocks=16, block_size=block, num_kv_heads=kv_heads, head_dim=dim, dtype=kv_dtype
    )
    (cache,) = backend.allocate_kv_cache(spec)
    # sequence A: 6 tokens then a chunk of 5; sequence B: 9 tokens then one decode token
    tables = {"a": [7, 2, 11, 0], "b": [5, 9, 3, 14]}
    history = {
        name: (rng.standard_normal((n, kv_heads, dim)), rng.standard_normal((n, kv_heads, dim)))
        for name, n in (("a", 11), ("b", 10))
    }

    def layout(parts):
        ids, positions, slots, qlens, clens = [], [], [], [], []
        for name, start, end in parts:
            pos = np.arange(start, end)
            table = np.array(tables[name])
            positions.append(pos)
            slots.append(table[pos // block] * block + pos % block)
            qlens.append(end - start)
            clens.append(end)
            ids.append(np.zeros(end - start, np.int64))
        return BatchLayout(
            input_ids=np.concatenate(ids),
            positions=np.concatenate(positions),
            slot_mapping=np.concatenate(slots),
            query_lens=np.array(qlens),
            context_lens=np.array(clens),
            block_tables=np.array([tables[name] for name, _, _ in parts]),
            logits_indices=np.array([0]),
            block_size=block,
        )

    def kv(parts):
        keys = np.concatenate([history[name][0][s:e] for name, s, e in parts]).astype(np.float32)
        vals = np.concatenate([history[name][1][s:e] for name, s, e in parts]).astype(np.float32)
        return keys, vals

    first = [("a", 0, 6), ("b", 0, 9)]
    q1 = rng.standard_normal((15, heads, dim)).astype(np.float32)
    backend.attention(q1, *kv(first), cache, backend.prepare_batch(layout(first)), 0.3)
    second = [("b", 9, 10), ("a", 6, 11)]  # a decode and a continued prefill in one pass
    q2 = rng.standard_normal((6, heads, dim)).astype(np.float32)
    out = backend.attention(q2, *kv(second), cache, backend.prepare_batch(layout(second)), 0.3)
    cached = {name: tuple(cached_values(x, kv_dtype) for x in pair) for name, pair in history.items()}
    expected_b = reference_attention(q2[:1], *cached["b"], 0.3)
    expected_a = reference_attention(q2[1:], *cached["a"], 0.3)
    np.testing.assert_allclose(out[:1], expected_b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[1:], expected_a, rtol=1e-4, atol=1e-5)


def test_rotary_rotates_each_half_pair(backend):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    positions = np.array([0, 5, 2])
    inv_freq = 1.0 / 10000 ** (np.arange(0, 8, 2) / 8)
    angles = np.outer(np.arange(8), inv_freq)
    out = backend.rotary_embedding(
        x, positions, np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    )
    for t, p in enumerate(positions):
        for i in range(4):
            c, s = np.cos(p * inv_freq[i]), np.sin(p * inv_freq[i])
            a, b = x[t, :, i], x[t, :, i + 4]
            np.testing.assert_allclose(out[t, :, i], a * c - b * s, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(out[t, :, i + 4], b * c + a * s, rtol=1e-5, atol=1e-6)


def test_rms_norm_with_residual(backend):
    rng = np.random.default_rng(2)
    x, residual, weight = (rng.standard_normal(s).astype(np.float32) for s in ((4, 16), (4, 16), (16,)))
    normed, new_residual = backend.rms_norm(x, weight, 1e-6, residual)
    total = x.astype(np.float64) + residual
    expected = total / np.sqrt((total**2).mean(axis=-1, keepdims=True) + 1e-6) * weight
    np.testing.assert_allclose(new_residual, total, rtol=1e-6)
    np.testing.assert_allclose(normed, expected, rtol=1e-5, atol=1e-6)


def test_silu_and_mul(backend):
    x = np.array([[-30.0, 0.0, 2.0, 3.0, 4.0, 5.0]], dtype=np.float32)
    gate, up = x[:, :3].astype(np.float64), x[:, 3:]
    expected = gate / (1 + np.exp(-gate)) * up
    np.testing.assert_allclose(backend.silu_and_mul(x), expected, rtol=1e-5, atol=1e-8)


def test_linear_with_fused_weight_and_bias(backend):
    rng = np.random.default_rng(3)
    w1, w2 = rng.standard_normal((3, 5)), rng.standard_normal((2, 5))
    b1, b2 = rng.standard_normal(3), rng.standard_normal(2)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    out = backend.linear(x, backend.linear_weight(w1, w2), backend.linear_bias(b1, b2))
    expected = np.concatenate([x @ w1.T + b1, x @ w2.T + b2], axis=1)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_non_float32_dtype_is_refused():
    with pytest.raises(InvalidArgumentError, match="float32"):
        CpuBackend(BackendOptions(dtype="float16"))
