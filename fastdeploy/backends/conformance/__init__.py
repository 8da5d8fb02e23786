"""Backend conformance checks: what any device backend must compute, against numpy references.

A backend plugin runs these against itself; fastdeploy's test suite runs them for every
available registered backend (`tests/backends/test_conformance.py`, devices chosen with
`FD_CONFORMANCE_DEVICES`). Each op check takes a built backend and raises AssertionError with
the op's name on a mismatch, or returns a string saying why it does not apply (an optional
capability the backend does not offer). `check_greedy_generation` builds a whole `LLM` on the
device from a tiny random checkpoint and compares its greedy tokens with a numpy forward pass.

Tolerances are float32's; a backend computing in lower precision runs them with dtype float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend, BackendOptions, BatchLayout, KVCacheSpec
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.conformance.checkpoint import tiny_llama

RTOL, ATOL = 1e-4, 1e-5


def build_backend(device: str, threads: int | None = None) -> Backend:
    """The registered backend `device`, built as an `LLM` would build it (float32)."""
    from fastdeploy.backends.selection import create_backend
    from fastdeploy.plugins.registry import get_registry

    return create_backend(device, BackendOptions(threads=threads), get_registry())


def _close(name: str, actual: Any, expected: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> None:
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64), expected, rtol=rtol, atol=atol, err_msg=f"op {name}"
    )


def _random(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def check_embedding_and_gather(backend: Backend) -> None:
    rng = np.random.default_rng(10)
    table = _random(rng, 11, 6)
    ids = np.array([3, 0, 10, 3], dtype=np.int64)
    rows = backend.embedding(backend.from_numpy(ids), backend.from_numpy(table))
    _close("embedding", backend.to_numpy(rows), table[ids].astype(np.float64), rtol=0, atol=0)
    picked = backend.gather_rows(rows, backend.from_numpy(np.array([2, 0], dtype=np.int64)))
    _close("gather_rows", backend.to_numpy(picked), table[[10, 3]].astype(np.float64), rtol=0, atol=0)


def check_linear(backend: Backend) -> None:
    rng = np.random.default_rng(11)
    w1, w2 = _random(rng, 3, 5), _random(rng, 2, 5)
    b1, b2 = _random(rng, 3), _random(rng, 2)
    x = _random(rng, 4, 5)
    out = backend.linear(backend.from_numpy(x), backend.linear_weight(w1, w2), backend.linear_bias(b1, b2))
    expected = np.concatenate([x @ w1.T.astype(np.float64) + b1, x @ w2.T.astype(np.float64) + b2], axis=1)
    _close("linear (fused weight, bias)", backend.to_numpy(out), expected)
    plain = backend.linear(backend.from_numpy(x), backend.linear_weight(w1))
    _close("linear", backend.to_numpy(plain), x.astype(np.float64) @ w1.T)


def check_rms_norm(backend: Backend) -> None:
    rng = np.random.default_rng(12)
    x, residual, weight = _random(rng, 5, 48), _random(rng, 5, 48), _random(rng, 48)
    normed, _ = backend.rms_norm(backend.from_numpy(x), backend.from_numpy(weight), 1e-6)
    _close("rms_norm", backend.to_numpy(normed), ref.rms_norm(x, weight, 1e-6))
    normed, new_residual = backend.rms_norm(
        backend.from_numpy(x), backend.from_numpy(weight), 1e-6, backend.from_numpy(residual)
    )
    total = x.astype(np.float64) + residual
    _close("rms_norm residual", backend.to_numpy(new_residual), total)
    _close("rms_norm (x + residual)", backend.to_numpy(normed), ref.rms_norm(total, weight, 1e-6))


def check_layer_norm(backend: Backend) -> None:
    rng = np.random.default_rng(13)
    x, residual = _random(rng, 4, 40) + 3.0, _random(rng, 4, 40)
    weight, bias = _random(rng, 40), _random(rng, 40)
    normed, new_residual = backend.layer_norm(
        backend.from_numpy(x),
        backend.from_numpy(weight),
        backend.from_numpy(bias),
        1e-5,
        backend.from_numpy(residual),
    )
    total = x.astype(np.float64) + residual
    _close("layer_norm residual", backend.to_numpy(new_residual), total)
    _close("layer_norm", backend.to_numpy(normed), ref.layer_norm(total, weight, bias, 1e-5))
    plain, _ = backend.layer_norm(backend.from_numpy(x), backend.from_numpy(weight), None, 1e-5)
    _close("layer_norm without bias", backend.to_numpy(plain), ref.layer_norm(x, weight, None, 1e-5))


def check_activations(backend: Backend) -> None:
    x = np.linspace(-12, 12, 48, dtype=np.float32).reshape(2, 24)
    _close("gelu_tanh", backend.to_numpy(backend.gelu_tanh(backend.from_numpy(x))), ref.gelu_tanh(x))
    _close("silu_and_mul", backend.to_numpy(backend.silu_and_mul(backend.from_numpy(x))), ref.silu_and_mul(x))


def check_vision_ops(backend: Backend) -> None:
    """The ops vision encoders use: exact and quick GELU, segment attention (also from a fused
    projection with rotary), merge_rows."""
    rng = np.random.default_rng(7)
    x = np.linspace(-9, 9, 48, dtype=np.float32).reshape(2, 24)
    _close("gelu", backend.to_numpy(backend.gelu(backend.from_numpy(x))), ref.gelu_erf(x))
    _close("quick_gelu", backend.to_numpy(backend.quick_gelu(backend.from_numpy(x))), ref.quick_gelu(x))
    # short segments and tiny heads; then head_dim 64 over segments longer than a kernel's tiles
    for shape, bounds in (((11, 2, 8), [0, 4, 11]), ((150, 2, 64), [0, 70, 71, 150])):
        q, k, v = (_random(rng, *shape) for _ in range(3))
        out = backend.encoder_attention(*(backend.from_numpy(t) for t in (q, k, v)), np.asarray(bounds), 0.35)
        _close("encoder_attention", backend.to_numpy(out), ref.segment_attention(q, k, v, bounds, 0.35))
    # from a fused projection, q and k rotated by per-token tables (a vision tower's 2-D positions)
    tokens, heads, head_dim = 75, 2, 64
    qkv = _random(rng, tokens, 3 * heads * head_dim)
    positions = rng.integers(0, 40, tokens)
    inv_freq = 1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.outer(positions, inv_freq)
    cos, sin = (backend.from_numpy(f(angles).astype(np.float32)) for f in (np.cos, np.sin))
    bounds = [0, 70, 71, 75]
    out = backend.encoder_attention_qkv(backend.from_numpy(qkv), cos, sin, np.asarray(bounds), heads, 0.35)
    q, k, v = qkv.reshape(tokens, 3, heads, head_dim).transpose(1, 0, 2, 3)
    q, k = ref.rotary(q, positions, inv_freq), ref.rotary(k, positions, inv_freq)
    expected = ref.segment_attention(q, k, v, bounds, 0.35).reshape(tokens, heads * head_dim)
    _close("encoder_attention_qkv", backend.to_numpy(out), expected)
    a, b = _random(rng, 3, 5), _random(rng, 2, 5)
    rows_a, rows_b = np.array([4, 0, 2]), np.array([1, 3])
    merged = backend.merge_rows([(backend.from_numpy(a), rows_a), (backend.from_numpy(b), rows_b)], 5)
    expected = np.empty((5, 5))
    expected[rows_a], expected[rows_b] = a, b
    _close("merge_rows", backend.to_numpy(merged), expected)


def check_rotary(backend: Backend) -> None:
    rng = np.random.default_rng(14)
    positions = np.array([0, 7, 3, 12], dtype=np.int64)
    for head_dim, rotary_dim in ((16, 16), (16, 8)):  # full and partial rotary
        x = _random(rng, 4, 3, head_dim)
        inv_freq = 1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
        angles = np.outer(np.arange(16), inv_freq)
        out = backend.rotary_embedding(
            backend.from_numpy(x),
            backend.from_numpy(positions),
            backend.from_numpy(np.cos(angles).astype(np.float32)),
            backend.from_numpy(np.sin(angles).astype(np.float32)),
        )
        _close(
            f"rotary_embedding (rotary_dim {rotary_dim})",
            backend.to_numpy(out),
            ref.rotary(x, positions, inv_freq),
        )


def _layout(tables: dict[str, list[int]], parts: list[tuple[str, int, int]], block: int) -> BatchLayout:
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


def check_paged_attention(backend: Backend) -> None:
    """Two passes over scattered, non-contiguous blocks: prefills, then a decode next to a
    continued prefill chunk; grouped-query heads; the cache's last block is used."""
    rng = np.random.default_rng(15)
    heads, kv_heads, dim, block, num_blocks = 6, 2, 16, 4, 16
    spec = KVCacheSpec(
        num_layers=1, num_blocks=num_blocks, block_size=block, num_kv_heads=kv_heads, head_dim=dim
    )
    (cache,) = backend.allocate_kv_cache(spec)
    tables = {"a": [7, 2, 15, 0], "b": [5, 9, 3]}
    history = {
        name: (_random(rng, n, kv_heads, dim), _random(rng, n, kv_heads, dim))
        for name, n in (("a", 13), ("b", 10))
    }

    def run(parts: list[tuple[str, int, int]]) -> tuple[np.ndarray, np.ndarray]:
        keys = np.concatenate([history[name][0][s:e] for name, s, e in parts])
        values = np.concatenate([history[name][1][s:e] for name, s, e in parts])
        q = _random(rng, len(keys), heads, dim)
        out = backend.attention(
            backend.from_numpy(q),
            backend.from_numpy(keys),
            backend.from_numpy(values),
            cache,
            backend.prepare_batch(_layout(tables, parts, block)),
            0.25,
        )
        return q, backend.to_numpy(out)

    q, out = run([("a", 0, 6), ("b", 0, 9)])
    _close("attention prefill", out[:6], ref.causal_attention(q[:6], *(h[:6] for h in history["a"]), 0.25))
    _close("attention prefill", out[6:], ref.causal_attention(q[6:], *(h[:9] for h in history["b"]), 0.25))
    q, out = run([("b", 9, 10), ("a", 6, 13)])
    _close("attention decode", out[:1], ref.causal_attention(q[:1], *history["b"], 0.25))
    _close("attention chunked prefill", out[1:], ref.causal_attention(q[1:], *history["a"], 0.25))


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
    layout = _layout({"s": [2, 0]}, [("s", 0, 3)], 2)
    expected = []
    outputs = []
    for cache in caches:
        q, k, v = _random(rng, 3, 1, 8), _random(rng, 3, 1, 8), _random(rng, 3, 1, 8)
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
        _close(f"attention with layer {layer}'s cache", backend.to_numpy(out), want)


def check_verify_attention_and_rollback(backend: Backend) -> None:
    """Speculative decoding's verify pass: sequences with k+1 query tokens (a decode token plus
    drafts) next to plain decode rows; then a rejected draft's slots are written again with other
    keys and values (the rollback), and attention sees only the new ones."""
    rng = np.random.default_rng(18)
    heads, kv_heads, dim, block = 4, 2, 8, 4
    spec = KVCacheSpec(num_layers=1, num_blocks=12, block_size=block, num_kv_heads=kv_heads, head_dim=dim)
    (cache,) = backend.allocate_kv_cache(spec)
    tables = {"a": [3, 8, 1, 10, 5], "b": [0, 6, 2], "c": [11, 4, 7, 9]}
    keys = {name: _random(rng, 20, kv_heads, dim) for name in tables}
    values = {name: _random(rng, 20, kv_heads, dim) for name in tables}

    def run(parts: list[tuple[str, int, int]]) -> tuple[np.ndarray, np.ndarray]:
        q = _random(rng, sum(e - s for _, s, e in parts), heads, dim)
        out = backend.attention(
            backend.from_numpy(q),
            backend.from_numpy(np.concatenate([keys[n][s:e] for n, s, e in parts])),
            backend.from_numpy(np.concatenate([values[n][s:e] for n, s, e in parts])),
            cache,
            backend.prepare_batch(_layout(tables, parts, block)),
            0.3,
        )
        return q, backend.to_numpy(out)

    def expect(name: str, q: np.ndarray, end: int) -> np.ndarray:
        return ref.causal_attention(q, keys[name][:end], values[name][:end], 0.3)

    run([("a", 0, 13), ("b", 0, 9), ("c", 0, 10)])
    q, out = run([("a", 13, 17), ("b", 9, 10), ("c", 10, 16)])  # 3 drafts, a decode, 5 drafts
    _close("verify attention (k+1 query tokens)", out[:4], expect("a", q[:4], 17))
    _close("verify attention next to a decode row", out[4:5], expect("b", q[4:5], 10))
    _close("verify attention (k+1 query tokens)", out[5:], expect("c", q[5:], 16))
    # a accepted one draft (positions 13, 14 stand), c accepted none (10 stands): the slots of the
    # rejected drafts are written again with the tokens that replace them
    for name, start in (("a", 15), ("c", 11)):
        keys[name][start:] = _random(rng, 20 - start, kv_heads, dim)
        values[name][start:] = _random(rng, 20 - start, kv_heads, dim)
    q, out = run([("c", 11, 14), ("a", 15, 16)])
    _close("attention after rollback", out[:3], expect("c", q[:3], 14))
    _close("attention after rollback", out[3:], expect("a", q[3:], 16))


def check_kv_block_copy(backend: Backend) -> str | None:
    """Copy-on-write for beam search (optional): a copied block reads like its source, in every
    layer, and writing into the copy leaves the source as it was."""
    rng = np.random.default_rng(19)
    block, dim = 4, 8
    spec = KVCacheSpec(num_layers=2, num_blocks=6, block_size=block, num_kv_heads=1, head_dim=dim)
    caches = backend.allocate_kv_cache(spec)
    keys = [_random(rng, 4, 1, dim) for _ in caches]
    values = [_random(rng, 4, 1, dim) for _ in caches]

    def attend(
        layer: int, table: list[int], start: int, end: int, k: np.ndarray, v: np.ndarray
    ) -> np.ndarray:
        q = _random(rng, end - start, 2, dim)
        out = backend.attention(
            backend.from_numpy(q),
            backend.from_numpy(k[start:end]),
            backend.from_numpy(v[start:end]),
            caches[layer],
            backend.prepare_batch(_layout({"s": table}, [("s", start, end)], block)),
            0.5,
        )
        return q, backend.to_numpy(out)

    for layer in range(2):
        attend(layer, [4], 0, 3, keys[layer], values[layer])  # 3 of block 4's slots written
    try:
        backend.copy_kv_blocks(caches, np.array([[4, 1]], dtype=np.int64), block)
    except NotImplementedError:
        return "backend cannot copy KV blocks (copy_kv_blocks): beam search is refused on it"
    for layer in range(2):
        forked_k, forked_v = keys[layer].copy(), values[layer].copy()
        forked_k[3], forked_v[3] = _random(rng, 1, dim), _random(rng, 1, dim)
        q, out = attend(layer, [1], 3, 4, forked_k, forked_v)
        _close(f"copy_kv_blocks (layer {layer})", out, ref.causal_attention(q, forked_k, forked_v, 0.5))
        q, out = attend(layer, [4], 3, 4, keys[layer], values[layer])
        _close(
            f"copy_kv_blocks leaves the source (layer {layer})",
            out,
            ref.causal_attention(q, keys[layer], values[layer], 0.5),
        )
    return None


def check_sampling(backend: Backend) -> str | None:
    """Device sampling (optional): each row's token equals the numpy definition's."""
    rng = np.random.default_rng(17)
    rows, vocab = 8, 200
    logits = (_random(rng, rows, vocab) * 3).astype(np.float32)
    temperatures = np.array([1.0, 0.7, 1.3, 1.0, 0.5, 2.0, 1.0, 0.9], dtype=np.float32)
    top_k = np.array([0, 5, 50, 1, 0, 300, 20, 0], dtype=np.int32)
    top_p = np.array([1.0, 0.9, 0.5, 1.0, 0.3, 0.95, 0.8, 0.6], dtype=np.float32)
    uniforms = rng.random(rows).astype(np.float32)
    if not backend.samples_on_device:
        return "backend leaves sampling to the host sampler (samples_on_device is False)"
    tokens = backend.sample_top_k_top_p(backend.from_numpy(logits), temperatures, top_k, top_p, uniforms)
    expected = [
        ref.sample_top_k_top_p(
            logits[i], float(temperatures[i]), int(top_k[i]), float(top_p[i]), float(uniforms[i])
        )
        for i in range(rows)
    ]
    if list(np.asarray(tokens)) != expected:
        raise AssertionError(f"op sample_top_k_top_p: got {list(np.asarray(tokens))}, expected {expected}")
    return None


def check_token_bitmask(backend: Backend) -> None:
    """Guided decoding's mask: forbidden tokens of the listed rows become -inf, nothing else moves.

    Three calls: two of five rows, the same two listed in the other order, and every row in order
    (backends may take a shortcut there)."""
    rng = np.random.default_rng(18)
    rows, vocab = 5, 70  # 70 tokens: three int32 words, the last one partly used
    logits = _random(rng, rows, vocab)
    allowed = {0: [2], 1: [0, 31, 32, 69], 2: list(range(64)), 3: [5, 40, 63, 64], 4: list(range(vocab))}
    for listed in ([1, 3], [3, 1], [0, 1, 2, 3, 4]):
        bitmask = np.zeros((len(listed), 3), dtype=np.uint32)
        for i, row in enumerate(listed):
            for token in allowed[row]:
                bitmask[i, token // 32] |= np.uint32(1 << (token % 32))
        expected = logits.astype(np.float64)
        for row in listed:
            keep = expected[row, allowed[row]].copy()
            expected[row] = -np.inf
            expected[row, allowed[row]] = keep
        out = backend.apply_token_bitmask(
            backend.from_numpy(logits), bitmask.view(np.int32), np.array(listed, dtype=np.int64)
        )
        _close(f"apply_token_bitmask (rows {listed})", backend.to_numpy(out), expected, rtol=0, atol=0)


def check_nonfinite_rows(backend: Backend) -> None:
    """Fault isolation's logits check: a row is broken when it holds a NaN or +inf or only -inf;
    -inf entries beside finite ones are masked tokens, which is fine."""
    logits = np.ones((6, 40), dtype=np.float32)
    logits[1, 7] = np.nan
    logits[2, 39] = np.inf
    logits[3] = -np.inf
    logits[4, :30] = -np.inf
    logits[5, 0] = np.nan
    logits[5, 1:] = -np.inf
    got = np.asarray(backend.nonfinite_rows(backend.from_numpy(logits))).astype(bool).tolist()
    expected = [False, True, True, True, False, True]
    if got != expected:
        raise AssertionError(f"op nonfinite_rows: got {got}, expected {expected}")


#: op-level checks, each `check(backend) -> None | skip reason`
OP_CHECKS: dict[str, Callable[[Backend], str | None]] = {
    "embedding_and_gather": check_embedding_and_gather,
    "linear": check_linear,
    "rms_norm": check_rms_norm,
    "layer_norm": check_layer_norm,
    "activations": check_activations,
    "rotary": check_rotary,
    "vision_ops": check_vision_ops,
    "paged_attention": check_paged_attention,
    "kv_cache_layers": check_kv_cache_layers_are_independent,
    "verify_attention": check_verify_attention_and_rollback,
    "kv_block_copy": check_kv_block_copy,
    "sampling": check_sampling,
    "token_bitmask": check_token_bitmask,
    "nonfinite_rows": check_nonfinite_rows,
}


def check_greedy_generation(device: str, directory: str, new_tokens: int = 12) -> list[int]:
    """`LLM(device=device)` on a tiny random Llama greedily produces the numpy forward's tokens.

    Two prompts run as one batch (so prefill and decode share passes); returns the first
    prompt's tokens.
    """
    from fastdeploy import LLM, SamplingParams

    config, weights = tiny_llama(directory)
    prompts = [[72, 101, 108, 108, 111, 44, 32], [87, 111, 114, 108, 100]]
    llm = LLM(
        model=directory,
        device=device,
        dtype="float32",
        max_model_len=64,
        block_size=4,
        num_gpu_blocks_override=64,
    )
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    results = []
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = ref.greedy_tokens(lambda ids: ref.llama_logits(weights, config, ids), prompt, new_tokens)
        got = list(output.outputs.token_ids)
        if got != expected:
            raise AssertionError(f"greedy generation on {device}: got {got}, numpy reference {expected}")
        results.append(got)
    return results[0]
