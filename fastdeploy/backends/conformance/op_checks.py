"""The op checks of the conformance suite: each primitive of the ops part against numpy.

Each check takes a built backend and raises AssertionError naming the op on a mismatch, or
returns a string saying why it does not apply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.types import BatchLayout, KVCacheSpec

RTOL, ATOL = 1e-4, 1e-5


def assert_close(
    name: str, actual: Any, expected: np.ndarray, rtol: float = RTOL, atol: float = ATOL
) -> None:
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64), expected, rtol=rtol, atol=atol, err_msg=f"op {name}"
    )


def random_normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def check_embedding_and_gather(backend: Backend) -> None:
    rng = np.random.default_rng(10)
    table = random_normal(rng, 11, 6)
    ids = np.array([3, 0, 10, 3], dtype=np.int64)
    rows = backend.embedding(backend.from_numpy(ids), backend.from_numpy(table))
    assert_close("embedding", backend.to_numpy(rows), table[ids].astype(np.float64), rtol=0, atol=0)
    picked = backend.gather_rows(rows, backend.from_numpy(np.array([2, 0], dtype=np.int64)))
    assert_close("gather_rows", backend.to_numpy(picked), table[[10, 3]].astype(np.float64), rtol=0, atol=0)


def check_linear(backend: Backend) -> None:
    rng = np.random.default_rng(11)
    w1, w2 = random_normal(rng, 3, 5), random_normal(rng, 2, 5)
    b1, b2 = random_normal(rng, 3), random_normal(rng, 2)
    x = random_normal(rng, 4, 5)
    out = backend.linear(backend.from_numpy(x), backend.linear_weight(w1, w2), backend.linear_bias(b1, b2))
    expected = np.concatenate([x @ w1.T.astype(np.float64) + b1, x @ w2.T.astype(np.float64) + b2], axis=1)
    assert_close("linear (fused weight, bias)", backend.to_numpy(out), expected)
    plain = backend.linear(backend.from_numpy(x), backend.linear_weight(w1))
    assert_close("linear", backend.to_numpy(plain), x.astype(np.float64) @ w1.T)


def check_rms_norm(backend: Backend) -> None:
    rng = np.random.default_rng(12)
    x, residual, weight = random_normal(rng, 5, 48), random_normal(rng, 5, 48), random_normal(rng, 48)
    normed, _ = backend.rms_norm(backend.from_numpy(x), backend.from_numpy(weight), 1e-6)
    assert_close("rms_norm", backend.to_numpy(normed), ref.rms_norm(x, weight, 1e-6))
    normed, new_residual = backend.rms_norm(
        backend.from_numpy(x), backend.from_numpy(weight), 1e-6, backend.from_numpy(residual)
    )
    total = x.astype(np.float64) + residual
    assert_close("rms_norm residual", backend.to_numpy(new_residual), total)
    assert_close("rms_norm (x + residual)", backend.to_numpy(normed), ref.rms_norm(total, weight, 1e-6))


def check_layer_norm(backend: Backend) -> None:
    rng = np.random.default_rng(13)
    x, residual = random_normal(rng, 4, 40) + 3.0, random_normal(rng, 4, 40)
    weight, bias = random_normal(rng, 40), random_normal(rng, 40)
    normed, new_residual = backend.layer_norm(
        backend.from_numpy(x),
        backend.from_numpy(weight),
        backend.from_numpy(bias),
        1e-5,
        backend.from_numpy(residual),
    )
    total = x.astype(np.float64) + residual
    assert_close("layer_norm residual", backend.to_numpy(new_residual), total)
    assert_close("layer_norm", backend.to_numpy(normed), ref.layer_norm(total, weight, bias, 1e-5))
    plain, _ = backend.layer_norm(backend.from_numpy(x), backend.from_numpy(weight), None, 1e-5)
    assert_close("layer_norm without bias", backend.to_numpy(plain), ref.layer_norm(x, weight, None, 1e-5))


def check_activations(backend: Backend) -> None:
    x = np.linspace(-12, 12, 48, dtype=np.float32).reshape(2, 24)
    assert_close("gelu_tanh", backend.to_numpy(backend.gelu_tanh(backend.from_numpy(x))), ref.gelu_tanh(x))
    assert_close(
        "silu_and_mul", backend.to_numpy(backend.silu_and_mul(backend.from_numpy(x))), ref.silu_and_mul(x)
    )


def check_rotary(backend: Backend) -> None:
    rng = np.random.default_rng(14)
    positions = np.array([0, 7, 3, 12], dtype=np.int64)
    for head_dim, rotary_dim in ((16, 16), (16, 8)):  # full and partial rotary
        x = random_normal(rng, 4, 3, head_dim)
        inv_freq = 1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
        angles = np.outer(np.arange(16), inv_freq)
        out = backend.rotary_embedding(
            backend.from_numpy(x),
            backend.from_numpy(positions),
            backend.from_numpy(np.cos(angles).astype(np.float32)),
            backend.from_numpy(np.sin(angles).astype(np.float32)),
        )
        assert_close(
            f"rotary_embedding (rotary_dim {rotary_dim})",
            backend.to_numpy(out),
            ref.rotary(x, positions, inv_freq),
        )


def batch_layout(tables: dict[str, list[int]], parts: list[tuple[str, int, int]], block: int) -> BatchLayout:
    positions, slots, query_lens, context_lens = [], [], [], []
    for name, start, end in parts:
        pos = np.arange(start, end)
        table = np.array(tables[name])
        positions.append(pos)
        slots.append(table[pos // block] * block + pos % block)
        query_lens.append(end - start)
        context_lens.append(end)
    width = max(len(tables[name]) for name, _, _ in parts)
    return BatchLayout(
        input_ids=np.zeros(sum(query_lens), dtype=np.int64),
        positions=np.concatenate(positions).astype(np.int64),
        slot_mapping=np.concatenate(slots).astype(np.int64),
        query_lens=np.array(query_lens, dtype=np.int64),
        context_lens=np.array(context_lens, dtype=np.int64),
        block_tables=np.array([tables[name] + [0] * (width - len(tables[name])) for name, _, _ in parts]),
        logits_indices=np.array([0], dtype=np.int64),
        block_size=block,
    )


#: one pass of a paged-attention check: (sequence, first position, end) parts, and the block tables
Pass = tuple[list[tuple[str, int, int]], dict[str, list[int]]]


def check_attention_passes(
    backend: Backend,
    label: str,
    attend: Callable[[Any, Any, Any, Any, Any], Any],
    reference: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    rng: np.random.Generator,
    shape: tuple[int, int, int, int, int],
    lengths: dict[str, int],
    passes: list[Pass],
) -> None:
    """The driver of the paged-attention checks: random keys and values per sequence (`lengths`),
    then each pass's parts computed together by `attend(q, keys, values, cache, batch)` over one
    cache of `shape` = (heads, kv_heads, head_dim, block_size, num_blocks), each part's rows
    against `reference(q, keys, values)` over its sequence's history up to the part's end."""
    heads, kv_heads, dim, block, num_blocks = shape
    spec = KVCacheSpec(
        num_layers=1, num_blocks=num_blocks, block_size=block, num_kv_heads=kv_heads, head_dim=dim
    )
    (cache,) = backend.allocate_kv_cache(spec)
    history = {
        name: (random_normal(rng, n, kv_heads, dim), random_normal(rng, n, kv_heads, dim))
        for name, n in lengths.items()
    }
    for parts, tables in passes:
        keys = np.concatenate([history[name][0][s:e] for name, s, e in parts])
        values = np.concatenate([history[name][1][s:e] for name, s, e in parts])
        q = random_normal(rng, len(keys), heads, dim)
        batch = backend.prepare_batch(batch_layout(tables, parts, block))
        out = backend.to_numpy(attend(*(backend.from_numpy(t) for t in (q, keys, values)), cache, batch))
        row = 0
        for name, start, end in parts:
            rows = slice(row, row + end - start)
            expected = reference(q[rows], history[name][0][:end], history[name][1][:end])
            assert_close(f"{label}, sequence {name} positions {start}..{end - 1}", out[rows], expected)
            row += end - start


def check_paged_attention(backend: Backend) -> None:
    """Two passes over scattered, non-contiguous blocks: prefills, then a decode next to a
    continued prefill chunk; grouped-query heads; the cache's last block is used."""
    tables = {"a": [7, 2, 15, 0], "b": [5, 9, 3]}
    check_attention_passes(
        backend,
        "attention",
        lambda q, k, v, cache, batch: backend.attention(q, k, v, cache, batch, 0.25),
        lambda q, k, v: ref.causal_attention(q, k, v, 0.25),
        np.random.default_rng(15),
        (6, 2, 16, 4, 16),
        {"a": 13, "b": 10},
        [([("a", 0, 6), ("b", 0, 9)], tables), ([("b", 9, 10), ("a", 6, 13)], tables)],
    )


def check_kv_cache_layers_are_independent(backend: Backend) -> None:
    """Each layer's cache holds its own keys: the same slots written with different values in
    two layers give each layer's own attention result."""
    rng = np.random.default_rng(16)
    spec = KVCacheSpec(num_layers=2, num_blocks=3, block_size=2, num_kv_heads=1, head_dim=8)
    caches = backend.allocate_kv_cache(spec)
    if len(caches) != spec.num_layers:
        raise AssertionError(f"allocate_kv_cache returned {len(caches)} layers, expected {spec.num_layers}")
    if backend.free_memory_bytes() <= 0:
        raise AssertionError("free_memory_bytes() must be positive")
    layout = batch_layout({"s": [2, 0]}, [("s", 0, 3)], 2)
    expected = []
    outputs = []
    for cache in caches:
        q, k, v = random_normal(rng, 3, 1, 8), random_normal(rng, 3, 1, 8), random_normal(rng, 3, 1, 8)
        out = backend.attention(
            backend.from_numpy(q),
            backend.from_numpy(k),
            backend.from_numpy(v),
            cache,
            backend.prepare_batch(layout),
            0.3,
        )
        outputs.append(out)
        expected.append(ref.causal_attention(q, k, v, 0.3))
    for layer, (out, want) in enumerate(zip(outputs, expected, strict=True)):
        assert_close(f"attention with layer {layer}'s cache", backend.to_numpy(out), want)


def check_verify_attention_and_rollback(backend: Backend) -> None:
    """Speculative decoding's verify pass: sequences with k+1 query tokens (a decode token plus
    drafts) next to plain decode rows; then a rejected draft's slots are written again with other
    keys and values (the rollback), and attention sees only the new ones."""
    rng = np.random.default_rng(18)
    heads, kv_heads, dim, block = 4, 2, 8, 4
    spec = KVCacheSpec(num_layers=1, num_blocks=12, block_size=block, num_kv_heads=kv_heads, head_dim=dim)
    (cache,) = backend.allocate_kv_cache(spec)
    tables = {"a": [3, 8, 1, 10, 5], "b": [0, 6, 2], "c": [11, 4, 7, 9]}
    keys = {name: random_normal(rng, 20, kv_heads, dim) for name in tables}
    values = {name: random_normal(rng, 20, kv_heads, dim) for name in tables}

    def run(parts: list[tuple[str, int, int]]) -> tuple[np.ndarray, np.ndarray]:
        q = random_normal(rng, sum(e - s for _, s, e in parts), heads, dim)
        out = backend.attention(
            backend.from_numpy(q),
            backend.from_numpy(np.concatenate([keys[n][s:e] for n, s, e in parts])),
            backend.from_numpy(np.concatenate([values[n][s:e] for n, s, e in parts])),
            cache,
            backend.prepare_batch(batch_layout(tables, parts, block)),
            0.3,
        )
        return q, backend.to_numpy(out)

    def expect(name: str, q: np.ndarray, end: int) -> np.ndarray:
        return ref.causal_attention(q, keys[name][:end], values[name][:end], 0.3)

    run([("a", 0, 13), ("b", 0, 9), ("c", 0, 10)])
    q, out = run([("a", 13, 17), ("b", 9, 10), ("c", 10, 16)])  # 3 drafts, a decode, 5 drafts
    assert_close("verify attention (k+1 query tokens)", out[:4], expect("a", q[:4], 17))
    assert_close("verify attention next to a decode row", out[4:5], expect("b", q[4:5], 10))
    assert_close("verify attention (k+1 query tokens)", out[5:], expect("c", q[5:], 16))
    # a accepted one draft (positions 13, 14 stand), c accepted none (10 stands): the slots of the
    # rejected drafts are written again with the tokens that replace them
    for name, start in (("a", 15), ("c", 11)):
        keys[name][start:] = random_normal(rng, 20 - start, kv_heads, dim)
        values[name][start:] = random_normal(rng, 20 - start, kv_heads, dim)
    q, out = run([("c", 11, 14), ("a", 15, 16)])
    assert_close("attention after rollback", out[:3], expect("c", q[:3], 14))
    assert_close("attention after rollback", out[3:], expect("a", q[3:], 16))
