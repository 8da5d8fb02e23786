"""The capability checks of the conformance suite: each optional capability against numpy.

A capability with a portable default is checked whether the backend declares it or not (the
default must be right too); one without (device sampling, KV block copy, graph capture) is
checked only where declared, and the check says so otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.conformance.op_checks import (
    assert_close,
    batch_layout,
    check_attention_passes,
    random_normal,
)
from fastdeploy.backends.fused import AttentionBlock, MLPBlock
from fastdeploy.backends.types import KVCacheSpec


def check_vision_ops(backend: Backend) -> None:
    """The ops vision encoders use: exact and quick GELU, segment attention (also from a fused
    projection with rotary), merge_rows."""
    rng = np.random.default_rng(7)
    x = np.linspace(-9, 9, 48, dtype=np.float32).reshape(2, 24)
    assert_close("gelu", backend.to_numpy(backend.gelu(backend.from_numpy(x))), ref.gelu_erf(x))
    assert_close("quick_gelu", backend.to_numpy(backend.quick_gelu(backend.from_numpy(x))), ref.quick_gelu(x))
    # short segments and tiny heads; then head_dim 64 over segments longer than a kernel's tiles
    for shape, bounds in (((11, 2, 8), [0, 4, 11]), ((150, 2, 64), [0, 70, 71, 150])):
        q, k, v = (random_normal(rng, *shape) for _ in range(3))
        out = backend.encoder_attention(*(backend.from_numpy(t) for t in (q, k, v)), np.asarray(bounds), 0.35)
        assert_close("encoder_attention", backend.to_numpy(out), ref.segment_attention(q, k, v, bounds, 0.35))
    # from a fused projection, q and k rotated by per-token tables (a vision tower's 2-D positions)
    tokens, heads, head_dim = 75, 2, 64
    qkv = random_normal(rng, tokens, 3 * heads * head_dim)
    positions = rng.integers(0, 40, tokens)
    inv_freq = 1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.outer(positions, inv_freq)
    cos, sin = (backend.from_numpy(f(angles).astype(np.float32)) for f in (np.cos, np.sin))
    bounds = [0, 70, 71, 75]
    out = backend.encoder_attention_qkv(backend.from_numpy(qkv), cos, sin, np.asarray(bounds), heads, 0.35)
    q, k, v = qkv.reshape(tokens, 3, heads, head_dim).transpose(1, 0, 2, 3)
    q, k = ref.rotary(q, positions, inv_freq), ref.rotary(k, positions, inv_freq)
    expected = ref.segment_attention(q, k, v, bounds, 0.35).reshape(tokens, heads * head_dim)
    assert_close("encoder_attention_qkv", backend.to_numpy(out), expected)
    a, b = random_normal(rng, 3, 5), random_normal(rng, 2, 5)
    rows_a, rows_b = np.array([4, 0, 2]), np.array([1, 3])
    merged = backend.merge_rows([(backend.from_numpy(a), rows_a), (backend.from_numpy(b), rows_b)], 5)
    expected = np.empty((5, 5))
    expected[rows_a], expected[rows_b] = a, b
    assert_close("merge_rows", backend.to_numpy(merged), expected)


def check_attention_sinks(backend: Backend) -> str | None:
    """Attention sinks (optional): a prefill, then a decode next to a chunked prefill, grouped
    heads, sinks large (a head attending to almost nothing) and small."""
    if not backend.supports(Capability.ATTENTION_SINKS):
        return "backend has no attention sinks (Capability.ATTENTION_SINKS): GPT-OSS is refused on it"
    sinks = np.array([3.0, -2.0, 0.5, 8.0], np.float32)
    tables = {"a": [6, 1, 4], "b": [0, 7, 3]}
    check_attention_passes(
        backend,
        "attention_with_sinks",
        lambda q, k, v, cache, batch: backend.attention_with_sinks(
            q, k, v, cache, batch, 0.3, backend.from_numpy(sinks)
        ),
        lambda q, k, v: ref.causal_attention(q, k, v, 0.3, sinks),
        np.random.default_rng(23),
        (4, 2, 8, 4, 8),
        {"a": 11, "b": 11},
        [([("a", 0, 10), ("b", 0, 5)], tables), ([("a", 10, 11), ("b", 5, 11)], tables)],
    )
    return None


def check_kv_block_copy(backend: Backend) -> str | None:
    """Copy-on-write for beam search (optional): a copied block reads like its source, in every
    layer, and writing into the copy leaves the source as it was."""
    if not backend.supports(Capability.KV_BLOCK_COPY):
        return "backend cannot copy KV blocks (Capability.KV_BLOCK_COPY): beam search is refused on it"
    rng = np.random.default_rng(19)
    block, dim = 4, 8
    spec = KVCacheSpec(num_layers=2, num_blocks=6, block_size=block, num_kv_heads=1, head_dim=dim)
    caches = backend.allocate_kv_cache(spec)
    keys = [random_normal(rng, 4, 1, dim) for _ in caches]
    values = [random_normal(rng, 4, 1, dim) for _ in caches]

    def attend(
        layer: int, table: list[int], start: int, end: int, k: np.ndarray, v: np.ndarray
    ) -> np.ndarray:
        q = random_normal(rng, end - start, 2, dim)
        out = backend.attention(
            backend.from_numpy(q),
            backend.from_numpy(k[start:end]),
            backend.from_numpy(v[start:end]),
            caches[layer],
            backend.prepare_batch(batch_layout({"s": table}, [("s", start, end)], block)),
            0.5,
        )
        return q, backend.to_numpy(out)

    for layer in range(2):
        attend(layer, [4], 0, 3, keys[layer], values[layer])  # 3 of block 4's slots written
    backend.copy_kv_blocks(caches, np.array([[4, 1]], dtype=np.int64), block)
    for layer in range(2):
        forked_k, forked_v = keys[layer].copy(), values[layer].copy()
        forked_k[3], forked_v[3] = random_normal(rng, 1, dim), random_normal(rng, 1, dim)
        q, out = attend(layer, [1], 3, 4, forked_k, forked_v)
        assert_close(f"copy_kv_blocks (layer {layer})", out, ref.causal_attention(q, forked_k, forked_v, 0.5))
        q, out = attend(layer, [4], 3, 4, keys[layer], values[layer])
        assert_close(
            f"copy_kv_blocks leaves the source (layer {layer})",
            out,
            ref.causal_attention(q, keys[layer], values[layer], 0.5),
        )
    return None


def check_kv_block_transfer(backend: Backend) -> str | None:
    """Prefill/decode disaggregation (optional): blocks read out hold the keys and values the
    attention wrote, at [block, slot, kv head, dim]; written into other blocks, attention over
    them reads them as it read the originals."""
    if not backend.supports(Capability.KV_BLOCK_TRANSFER):
        return (
            "backend cannot read or write KV blocks (Capability.KV_BLOCK_TRANSFER): disaggregation is refused"
        )
    rng = np.random.default_rng(23)
    block, dim, heads = 4, 8, 2
    spec = KVCacheSpec(num_layers=2, num_blocks=6, block_size=block, num_kv_heads=heads, head_dim=dim)
    caches = backend.allocate_kv_cache(spec)
    keys = [random_normal(rng, 6, heads, dim) for _ in caches]
    values = [random_normal(rng, 6, heads, dim) for _ in caches]

    def attend(layer: int, table: list[int], start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        q = random_normal(rng, end - start, heads, dim)
        out = backend.attention(
            backend.from_numpy(q),
            backend.from_numpy(keys[layer][start:end]),
            backend.from_numpy(values[layer][start:end]),
            caches[layer],
            backend.prepare_batch(batch_layout({"s": table}, [("s", start, end)], block)),
            0.5,
        )
        return q, backend.to_numpy(out)

    for layer in range(2):
        attend(layer, [4, 2], 0, 5)  # block 4 full, one slot of block 2
    arrays = backend.read_kv_blocks(caches, np.array([4, 2], dtype=np.int64), block)
    if len(arrays) != 4:
        raise AssertionError(
            f"read_kv_blocks: expected keys and values of 2 layers, got {len(arrays)} arrays"
        )
    for layer in range(2):
        for name, array, expected in (
            ("keys", arrays[2 * layer], keys),
            ("values", arrays[2 * layer + 1], values),
        ):
            if array.shape != (2, block, heads, dim):
                raise AssertionError(
                    f"read_kv_blocks: {name} of shape {array.shape}, expected (2, {block}, {heads}, {dim})"
                )
            read = array.reshape(2 * block, heads, dim)[:5].astype(np.float32)
            assert_close(f"read_kv_blocks {name} (layer {layer})", read, expected[layer][:5])
    backend.write_kv_blocks(caches, np.array([0, 5], dtype=np.int64), arrays, block)
    for layer in range(2):
        q, out = attend(layer, [0, 5], 5, 6)
        assert_close(
            f"write_kv_blocks (layer {layer})",
            out,
            ref.causal_attention(q, keys[layer][:6], values[layer][:6], 0.5),
        )
    return None


def check_sampling(backend: Backend) -> str | None:
    """Device sampling (optional): each row's token equals the numpy definition's."""
    rng = np.random.default_rng(17)
    rows, vocab = 8, 200
    logits = (random_normal(rng, rows, vocab) * 3).astype(np.float32)
    temperatures = np.array([1.0, 0.7, 1.3, 1.0, 0.5, 2.0, 1.0, 0.9], dtype=np.float32)
    top_k = np.array([0, 5, 50, 1, 0, 300, 20, 0], dtype=np.int32)
    top_p = np.array([1.0, 0.9, 0.5, 1.0, 0.3, 0.95, 0.8, 0.6], dtype=np.float32)
    uniforms = rng.random(rows).astype(np.float32)
    if not backend.supports(Capability.DEVICE_SAMPLING):
        return "backend leaves sampling to the host sampler (no Capability.DEVICE_SAMPLING)"
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
    logits = random_normal(rng, rows, vocab)
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
        assert_close(f"apply_token_bitmask (rows {listed})", backend.to_numpy(out), expected, rtol=0, atol=0)


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


def check_row_reductions(backend: Backend) -> None:
    """`argmax_rows` (the first of equal maxima) and `nonfinite_rows`."""
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [-1.0, -2.0, -0.5, -7.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    got = np.asarray(backend.argmax_rows(backend.from_numpy(logits))).tolist()
    if got != [1, 2, 0]:
        raise AssertionError(f"op argmax_rows: got {got}, expected [1, 2, 0]")
    check_nonfinite_rows(backend)


def check_async_tokens(backend: Backend) -> None:
    """`greedy_tokens` then `feed_tokens`: the pending tokens reach the host with the broken rows,
    and the next pass's input ids take them from the device."""
    rng = np.random.default_rng(21)
    logits = random_normal(rng, 4, 30)
    logits[2, 5] = np.inf  # broken, and its argmax
    pending = backend.greedy_tokens(backend.from_numpy(logits))
    fed = backend.feed_tokens(
        np.array([5, -1, 7, -1], dtype=np.int64),
        np.array([1, 3], dtype=np.int64),
        pending,
        np.array([2, 0], dtype=np.int64),
    )
    ids, broken = pending.wait()
    expected = logits.argmax(axis=-1)
    if np.asarray(ids).tolist() != expected.tolist():
        raise AssertionError(
            f"op greedy_tokens: got {np.asarray(ids).tolist()}, expected {expected.tolist()}"
        )
    if np.asarray(broken).astype(bool).tolist() != [False, False, True, False]:
        raise AssertionError(f"op greedy_tokens: broken rows {np.asarray(broken).tolist()}")
    got = np.asarray(backend.to_numpy(fed)).astype(np.int64).tolist()
    if got != [5, int(expected[2]), 7, int(expected[0])]:
        raise AssertionError(
            f"op feed_tokens: got {got}, expected {[5, int(expected[2]), 7, int(expected[0])]}"
        )


def check_moe(backend: Backend) -> None:
    """Routing with a selection bias (ERNIE-4.5's correction bias), grouped experts, and a rank's
    slice of the experts (expert parallelism)."""
    rng = np.random.default_rng(22)
    tokens, hidden, inner, experts, top_k = 9, 8, 6, 5, 2
    logits = random_normal(rng, tokens, experts)
    bias = rng.uniform(0.0, 0.3, experts).astype(np.float32)
    for selection_bias, renormalize in ((bias, True), (None, False)):
        weights, ids = backend.moe_route(
            backend.from_numpy(logits),
            top_k,
            None if selection_bias is None else backend.from_numpy(selection_bias),
            renormalize=renormalize,
            norm_min=1e-12,
        )
        want_weights, want_ids = ref.moe_route(logits, top_k, selection_bias, renormalize, 1e-12)
        got_ids = np.asarray(backend.to_numpy(ids)).astype(np.int64).tolist()
        if got_ids != want_ids.tolist():
            raise AssertionError(f"op moe_route: experts {got_ids}, expected {want_ids.tolist()}")
        assert_close("moe_route weights", backend.to_numpy(weights), want_weights)
    gate, up = ([random_normal(rng, inner, hidden) for _ in range(experts)] for _ in range(2))
    down = [random_normal(rng, hidden, inner) for _ in range(experts)]
    x = random_normal(rng, tokens, hidden)
    route = (backend.from_numpy(want_weights.astype(np.float32)), backend.from_numpy(want_ids))
    for first in (0, 2):  # all experts, then the slice 2.. of a rank
        held = backend.moe_expert_weights(gate[first:], up[first:], down[first:])
        out = backend.moe_experts(backend.from_numpy(x), held, *route, first_expert=first)
        expected = ref.moe_experts(x, gate[first:], up[first:], down[first:], want_weights, want_ids, first)
        assert_close(f"moe_experts (first_expert {first})", backend.to_numpy(out), expected, 1e-4, 1e-4)


def _decoder_layer(
    rng: np.random.Generator, hidden: int, heads: int, kv_heads: int, dim: int, qk_norm: bool, sinks: bool
) -> dict:
    inner = 24
    layer = {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": dim,
        "eps": 1e-6,
        "scale": dim**-0.5,
        "input_norm": 1.0 + 0.1 * random_normal(rng, hidden),
        "qkv": 0.2 * random_normal(rng, (heads + 2 * kv_heads) * dim, hidden),
        "o_proj": 0.2 * random_normal(rng, hidden, heads * dim),
        "post_norm": 1.0 + 0.1 * random_normal(rng, hidden),
        "gate_up": 0.2 * random_normal(rng, 2 * inner, hidden),
        "down": 0.2 * random_normal(rng, hidden, inner),
    }
    if qk_norm:  # Qwen3
        layer["q_norm"], layer["k_norm"] = (
            1.0 + 0.1 * random_normal(rng, dim),
            1.0 + 0.1 * random_normal(rng, dim),
        )
    else:
        layer["qkv_bias"] = 0.1 * random_normal(rng, (heads + 2 * kv_heads) * dim)
    if sinks:  # GPT-OSS: one head's sink large enough that it attends to almost nothing
        layer["sinks"] = np.array([3.0, -2.0, 0.5, 8.0], np.float32)[:heads]
    return layer


def _blocks(backend: Backend, layer: dict) -> tuple[AttentionBlock, MLPBlock]:
    put = backend.from_numpy
    attention = AttentionBlock(
        input_norm=put(layer["input_norm"]),
        qkv=backend.linear_weight(layer["qkv"]),
        o_proj=backend.linear_weight(layer["o_proj"]),
        num_heads=layer["heads"],
        num_kv_heads=layer["kv_heads"],
        head_dim=layer["head_dim"],
        eps=layer["eps"],
        scale=layer["scale"],
        qkv_bias=backend.linear_bias(layer["qkv_bias"]) if "qkv_bias" in layer else None,
        q_norm=put(layer["q_norm"]) if "q_norm" in layer else None,
        k_norm=put(layer["k_norm"]) if "k_norm" in layer else None,
        sinks=put(layer["sinks"]) if "sinks" in layer else None,
    )
    mlp = MLPBlock(
        put(layer["post_norm"]),
        backend.linear_weight(layer["gate_up"]),
        backend.linear_weight(layer["down"]),
        layer["eps"],
    )
    return attention, mlp


def check_decoder_layers(backend: Backend) -> None:
    """Two decoder layers (one with q/k biases, one with Qwen3's per-head q/k norms), and a third
    with attention sinks (`AttentionBlock.sinks`) on a backend with `Capability.ATTENTION_SINKS`,
    over a prompt, through `attention_block` + `mlp_block` and through `decoder_layers`: the
    residual stream after them equals the numpy layers'."""
    rng = np.random.default_rng(23)
    hidden, heads, kv_heads, dim, tokens, block = 32, 4, 2, 16, 6, 4
    kinds = [(False, False), (True, False)]
    if backend.supports(Capability.ATTENTION_SINKS):
        kinds.append((False, True))
    layers = [_decoder_layer(rng, hidden, heads, kv_heads, dim, *kind) for kind in kinds]
    blocks = [_blocks(backend, layer) for layer in layers]
    inv_freq = 1.0 / 10000 ** (np.arange(0, dim, 2) / dim)
    angles = np.outer(np.arange(16), inv_freq)
    cos, sin = (backend.from_numpy(f(angles).astype(np.float32)) for f in (np.cos, np.sin))
    layout = batch_layout({"s": [2, 0]}, [("s", 0, tokens)], block)
    positions = backend.from_numpy(layout.positions)
    x = random_normal(rng, tokens, hidden)
    expected = x.astype(np.float64)
    for layer in layers:
        expected = ref.decoder_layer(expected, layer, layout.positions, inv_freq)
    spec = KVCacheSpec(
        num_layers=len(layers), num_blocks=3, block_size=block, num_kv_heads=kv_heads, head_dim=dim
    )
    caches = backend.allocate_kv_cache(spec)
    out, residual = backend.from_numpy(x), None
    for (attention, mlp), cache in zip(blocks, caches, strict=True):
        out, residual = backend.attention_block(
            out, residual, attention, positions, cos, sin, backend.prepare_batch(layout), cache
        )
        out, residual = backend.mlp_block(out, residual, mlp)
    stream = backend.to_numpy(out).astype(np.float64) + backend.to_numpy(residual)
    assert_close("attention_block + mlp_block", stream, expected, 2e-4, 2e-4)
    out, residual = backend.decoder_layers(
        backend.from_numpy(x),
        None,
        blocks,
        positions,
        cos,
        sin,
        backend.prepare_batch(layout),
        backend.allocate_kv_cache(spec),
    )
    stream = backend.to_numpy(out).astype(np.float64) + backend.to_numpy(residual)
    assert_close("decoder_layers", stream, expected, 2e-4, 2e-4)


def check_sliding_window(backend: Backend) -> str | None:
    """`windowed_attention` (optional): a 7-position window over 4-slot blocks, so the window
    starts inside a block and whole blocks fall before it (then released: their table entries
    alias the other sequence's blocks, whose contents must not matter); prefill, then a decode
    beside a continued prefill chunk, against numpy (the fused layers' `AttentionBlock.window`
    path is checked by the models with sliding windows in tests/models)."""
    if not backend.supports(Capability.SLIDING_WINDOW):
        return (
            "backend has no sliding-window attention (Capability.SLIDING_WINDOW): models are refused past it"
        )
    window = 7
    check_attention_passes(
        backend,
        "windowed_attention",
        lambda q, k, v, cache, batch: backend.windowed_attention(q, k, v, cache, batch, 0.25, window),
        lambda q, k, v: ref.causal_attention(q, k, v, 0.25, window=window),
        np.random.default_rng(23),
        (4, 2, 16, 4, 12),
        {"a": 19, "b": 14},
        [
            ([("a", 0, 11), ("b", 0, 13)], {"a": [7, 2, 11, 0, 5], "b": [4, 9, 3, 1]}),
            ([("b", 13, 14), ("a", 11, 19)], {"a": [4, 2, 11, 0, 5], "b": [7, 9, 3, 1]}),
        ],
    )
    return None


def check_attention_softcap(backend: Backend) -> str | None:
    """`softcapped_attention` (optional): scores of about +-4 against a cap of 2 (so the cap
    binds), grouped heads; a prefill, then a decode beside a continued prefill chunk, against
    numpy; with a 5-position window too where the backend declares `Capability.SLIDING_WINDOW`
    (Gemma 2's sliding layers cap and slide). Also `softcap`, which caps Gemma 2's logits."""
    if not backend.supports(Capability.ATTENTION_SOFTCAP):
        return "backend has no attention logit soft-capping (Capability.ATTENTION_SOFTCAP): Gemma 2 is refused on it"
    rng = np.random.default_rng(29)
    logits = random_normal(rng, 3, 40) * np.float32(20)
    capped = backend.to_numpy(backend.softcap(backend.from_numpy(logits), 30.0))
    assert_close("softcap", capped, 30.0 * np.tanh(logits.astype(np.float64) / 30.0))
    cap = 2.0
    tables = {"a": [6, 1, 8, 4], "b": [0, 9, 3, 5]}
    for window in [0, 5] if backend.supports(Capability.SLIDING_WINDOW) else [0]:
        check_attention_passes(
            backend,
            f"softcapped_attention window={window}",
            lambda q, k, v, cache, batch, window=window: backend.softcapped_attention(
                q, k, v, cache, batch, 1.0, cap, window
            ),
            lambda q, k, v, window=window: ref.causal_attention(q, k, v, 1.0, window=window, softcap=cap),
            rng,
            (4, 2, 16, 4, 10),
            {"a": 14, "b": 14},
            [([("a", 0, 13), ("b", 0, 6)], tables), ([("a", 13, 14), ("b", 6, 14)], tables)],
        )
    return None


def check_graph_capture(backend: Backend) -> str | None:
    """Captured decode steps need a model and a GPU: `check_greedy_generation` on the device
    runs them; here only that a declaring backend implements `decode_graphs` (see the platform
    check of declarations)."""
    if not backend.supports(Capability.GRAPH_CAPTURE):
        return "backend runs decode steps eagerly (no Capability.GRAPH_CAPTURE)"
    if type(backend).decode_graphs is Backend.decode_graphs:
        raise AssertionError("Capability.GRAPH_CAPTURE is declared but decode_graphs is Backend's default")
    return None


def check_lora(backend: Backend) -> str | None:
    """LoRA's segmented products (optional): every row gets its own slot's (x @ a) @ b added,
    base rows (-1) nothing, with one adapter's rows both contiguous and scattered."""
    if not backend.supports(Capability.LORA):
        return "backend runs no LoRA adapters (Capability.LORA): enable_lora is refused on it"
    rng = np.random.default_rng(23)
    slots, rank, width_in, width_out = 3, 4, 16, 24
    # a fused projection of two parts (10 and 14 outputs), each with rank 2: B block-diagonal
    stack = backend.lora_stack(slots, rank, width_in, width_out, parts=(10, 14))
    a = random_normal(rng, slots, width_in, rank)
    b = random_normal(rng, slots, rank, width_out)
    b[:, :2, 10:] = 0
    b[:, 2:, :10] = 0
    for slot in (0, 2):  # slot 1 stays zero: a resident slot nobody targets adds nothing
        backend.set_lora_slot(stack, slot, a[slot], b[slot])
    a[1], b[1] = 0, 0
    # scattered rows of one adapter; then adapters' rows in slot order (contiguous); then none
    for slots in ([2, 2, -1, 0, 2, 1, -1, 0, 0], [-1, 0, 0, 2, 2], [-1, -1]):
        token_slots = np.array(slots, dtype=np.int64)
        x = random_normal(rng, token_slots.size, width_in)
        y = random_normal(rng, token_slots.size, width_out)
        expected = y.astype(np.float64)
        for row, slot in enumerate(slots):
            if slot >= 0:
                expected[row] += (x[row].astype(np.float64) @ a[slot]) @ b[slot]
        rows = backend.lora_rows(token_slots)
        out = backend.add_lora(backend.from_numpy(y), backend.from_numpy(x), stack, rows)
        assert_close(f"add_lora (slots {slots})", backend.to_numpy(out), expected)
    return None


def check_latent_attention(backend: Backend) -> str | None:
    """Multi-head latent attention (optional) over a "latent" cache in scattered blocks: two
    prefills, then a decode next to a continued prefill chunk, against explicit per-head keys
    and values."""
    if not backend.supports(Capability.LATENT_ATTENTION):
        return (
            "backend has no multi-head latent attention (Capability.LATENT_ATTENTION): DeepSeek-V3 is refused"
        )
    rng = np.random.default_rng(23)
    heads, nope, rope, lora, v_dim, block = 4, 16, 8, 12, 10, 4
    (cache,) = backend.allocate_kv_cache(KVCacheSpec(1, 16, block, 1, lora + rope, kind="latent"))
    absorb_k, absorb_v = random_normal(rng, heads, nope, lora), random_normal(rng, heads, v_dim, lora)
    tables = {"a": [7, 2, 15, 0], "b": [5, 9, 3]}
    history = {
        name: (random_normal(rng, n, lora), random_normal(rng, n, rope)) for name, n in (("a", 13), ("b", 10))
    }
    device = backend.from_numpy
    for parts in ([("a", 0, 6), ("b", 0, 9)], [("b", 9, 10), ("a", 6, 13)]):
        latent = np.concatenate([history[name][0][s:e] for name, s, e in parts])
        k_rope = np.concatenate([history[name][1][s:e] for name, s, e in parts])
        q_nope, q_rope = (
            random_normal(rng, len(latent), heads, nope),
            random_normal(rng, len(latent), heads, rope),
        )
        out = backend.latent_attention(
            device(q_nope),
            device(q_rope),
            device(latent),
            device(k_rope),
            cache,
            backend.prepare_batch(batch_layout(tables, parts, block)),
            device(absorb_k),
            device(absorb_v),
            0.2,
        )
        out, row = backend.to_numpy(out), 0
        for name, start, end in parts:
            rows = slice(row, row + end - start)
            expected = ref.latent_attention(
                q_nope[rows],
                q_rope[rows],
                history[name][0][:end],
                history[name][1][:end],
                absorb_k,
                absorb_v,
                0.2,
            )
            assert_close(f"latent_attention {name}[{start}:{end}]", out[rows], expected)
            row += end - start
    return None


#: one check per capability, `check(backend) -> None | skip reason`
CAPABILITY_CHECKS: dict[Capability, Callable[[Backend], str | None]] = {
    Capability.DEVICE_SAMPLING: check_sampling,
    Capability.TOKEN_BITMASK: check_token_bitmask,
    Capability.KV_BLOCK_COPY: check_kv_block_copy,
    Capability.KV_BLOCK_TRANSFER: check_kv_block_transfer,
    Capability.GRAPH_CAPTURE: check_graph_capture,
    Capability.FUSED_DECODER_LAYERS: check_decoder_layers,
    Capability.FUSED_MOE: check_moe,
    Capability.OVERLAPS_HOST: check_async_tokens,
    Capability.DEVICE_ROW_REDUCTIONS: check_row_reductions,
    Capability.VISION_OPS: check_vision_ops,
    Capability.LORA: check_lora,
    Capability.SLIDING_WINDOW: check_sliding_window,
    Capability.LATENT_ATTENTION: check_latent_attention,
    Capability.ATTENTION_SINKS: check_attention_sinks,
    Capability.ATTENTION_SOFTCAP: check_attention_softcap,
}
