"""Attention logit soft-capping (`Backend.softcapped_attention`, Gemma 2) on the cpu backend's
native kernels, on each instruction set the CPU runs (AVX2 code runs on AVX-512 machines too),
and on its numpy path, against a float64 reference written here: scores s = scale * q.k become
cap * tanh(s / cap) before the causal (and sliding-window) mask and the softmax.
"""

from __future__ import annotations

import numpy as np
import pytest
from kv_reference import KV_DTYPES, cached_values, one_sequence_layout

from fastdeploy.backends.base import BackendOptions, KVCacheSpec
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend


def _runs_here(isa: str) -> bool:
    best = native.best_isa()
    return best in native.ISAS and native.ISAS.index(isa) >= native.ISAS.index(best)


KERNELS = [
    pytest.param(isa, marks=pytest.mark.skipif(not _runs_here(isa), reason=f"no {isa} here"))
    for isa in native.ISAS
] + ["numpy"]
CAP = 2.5


def reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float, cap: float, window: int):
    """The last len(q) of len(keys) positions attending causally (to their last `window` where
    `window` > 0), scores capped at cap * tanh(s / cap) where `cap` > 0; float64."""
    length, heads, _ = q.shape
    context, kv_heads, _ = keys.shape
    out = np.empty(q.shape)
    for t in range(length):
        position = context - length + t
        first = max(0, position + 1 - window) if window else 0
        for h in range(heads):
            kh = h // (heads // kv_heads)
            scores = keys[first : position + 1, kh] @ q[t, h].astype(np.float64) * scale
            if cap:
                scores = cap * np.tanh(scores / cap)
            weights = np.exp(scores - scores.max())
            out[t, h] = (weights / weights.sum()) @ values[first : position + 1, kh]
    return out


@pytest.fixture(params=KERNELS)
def backend(request, monkeypatch):
    monkeypatch.setenv("FD_CPU_KERNELS", request.param)
    backend = CpuBackend(BackendOptions(threads=2))
    assert (backend.native_isa or "numpy") == request.param
    return backend


def _cache(backend: CpuBackend, blocks: int, block_size: int, kv_heads: int, head_dim: int, kv_dtype: str):
    (cache,) = backend.allocate_kv_cache(KVCacheSpec(1, blocks, block_size, kv_heads, head_dim, kv_dtype))
    return cache


@pytest.mark.parametrize("window", [0, 21])
@pytest.mark.parametrize(
    ("block_size", "head_dim", "heads", "kv_heads"), [(16, 64, 4, 2), (8, 128, 2, 2), (4, 24, 6, 3)]
)
def test_softcapped_attention_matches_float64(backend, window, block_size, head_dim, heads, kv_heads):
    """A prefill in two chunks (more than one query tile), then decodes, past a window that
    starts inside a block; scores of about +-8 against a cap of 2.5, so the cap binds (the
    uncapped reference is far from the capped one)."""
    assert backend.supports(Capability.ATTENTION_SOFTCAP)
    rng = np.random.default_rng(head_dim + window)
    context = 90
    blocks = -(-(context + 2) // block_size)
    table = rng.permutation(blocks + 3)[:blocks]
    cache = _cache(backend, blocks + 3, block_size, kv_heads, head_dim, "float32")
    keys = rng.standard_normal((context + 2, kv_heads, head_dim)).astype(np.float32)
    values = rng.standard_normal((context + 2, kv_heads, head_dim)).astype(np.float32)
    queries = rng.standard_normal((context + 2, heads, head_dim)).astype(np.float32)
    scale = 1.0
    for start, end in [(0, 40), (40, context), (context, context + 1), (context + 1, context + 2)]:
        out = backend.softcapped_attention(
            queries[start:end],
            keys[start:end],
            values[start:end],
            cache,
            backend.prepare_batch(one_sequence_layout(table, start, end, block_size)),
            scale,
            CAP,
            window,
        )
        args = (queries[start:end], keys[:end].astype(np.float64), values[:end].astype(np.float64), scale)
        expected = reference(*args, CAP, window)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=2e-5)
        assert np.abs(reference(*args, 0.0, window) - expected).max() > 0.1  # the cap binds


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_softcap_over_each_kv_cache_type(backend, kv_dtype):
    """The cap applies to the scores of every cache element type (int8's per-position key
    scales multiply the scores before the cap)."""
    if backend.native_isa is None and kv_dtype != "float32":
        pytest.skip("the numpy path keeps a float32 cache")
    rng = np.random.default_rng(7)
    block_size, head_dim, heads, kv_heads, context = 8, 32, 4, 2, 30
    table = np.array([3, 0, 5, 1])
    cache = _cache(backend, 6, block_size, kv_heads, head_dim, kv_dtype)
    keys = rng.standard_normal((context, kv_heads, head_dim)).astype(np.float32)
    values = rng.standard_normal((context, kv_heads, head_dim)).astype(np.float32)
    queries = rng.standard_normal((context, heads, head_dim)).astype(np.float32)
    out = backend.softcapped_attention(
        queries,
        keys,
        values,
        cache,
        backend.prepare_batch(one_sequence_layout(table, 0, context, block_size)),
        0.5,
        CAP,
        0,
    )
    expected = reference(queries, cached_values(keys, kv_dtype), cached_values(values, kv_dtype), 0.5, CAP, 0)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=2e-5)
