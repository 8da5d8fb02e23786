"""The fused MoE kernels (routing, sort by expert, grouped GEMMs), interpreted, against float64
numpy; and the backend's MoE ops on torch-cpu with the Triton kernels, as ERNIE-4.5 MoE calls them."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="Triton's interpreter needs torch (the test extra installs it)")
pytest.importorskip("triton", reason="the kernels are Triton kernels (the test extra installs triton)")
from fastdeploy.backends.cuda import triton_moe as moe  # noqa: E402
from fastdeploy.backends.cuda.launch import LARGE_SHARED_MEMORY  # noqa: E402

TOKENS, EXPERTS, TOP_K, HIDDEN, WIDTH = 37, 8, 3, 32, 24


def tensor(array):
    return torch.from_numpy(np.ascontiguousarray(array))


def _route_reference(logits, bias, top_k):
    probs = np.exp(logits - logits.max(1, keepdims=True)).astype(np.float64)
    probs /= probs.sum(1, keepdims=True)
    ids = np.argsort(-(probs + bias), axis=1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, ids, 1)
    return weights / weights.sum(1, keepdims=True), ids


def _experts_reference(x, w_gate_up, w_down, weights, ids):
    out = np.zeros((x.shape[0], w_down.shape[2]))
    for token in range(x.shape[0]):
        for k in range(ids.shape[1]):
            h = x[token].astype(np.float64) @ w_gate_up[ids[token, k]]
            gate, up = h[:WIDTH], h[WIDTH:]
            out[token] += weights[token, k] * ((gate / (1 + np.exp(-gate)) * up) @ w_down[ids[token, k]])
    return out


def test_routing_picks_by_biased_score_and_weights_by_probability():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((TOKENS, EXPERTS)).astype(np.float32)
    bias = (rng.standard_normal(EXPERTS) * 0.3).astype(np.float32)
    weights = np.zeros((TOKENS, TOP_K), np.float32)
    ids = np.zeros((TOKENS, TOP_K), np.int32)
    moe.moe_route(tensor(logits), tensor(bias), tensor(weights), tensor(ids), TOP_K, True, 1e-12)
    expected_weights, expected_ids = _route_reference(logits, bias, TOP_K)
    assert ids.tolist() == expected_ids.tolist()
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-5)


@pytest.mark.parametrize(("tokens", "hopper_tiles"), [(1, False), (TOKENS, False), (TOKENS, True)])
def test_sorted_grouped_gemms_equal_the_per_token_sum(tokens, hopper_tiles):
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, HIDDEN)).astype(np.float32)
    ids = rng.integers(0, EXPERTS, (tokens, TOP_K)).astype(np.int32)
    ids[0] = [5, 5, 2][:TOP_K]  # the same expert twice for one token
    weights = rng.random((tokens, TOP_K)).astype(np.float32)
    w_gate_up = (rng.standard_normal((EXPERTS, HIDDEN, 2 * WIDTH)) * 0.2).astype(np.float32)
    w_down = (rng.standard_normal((EXPERTS, WIDTH, HIDDEN)) * 0.2).astype(np.float32)
    config = moe.gemm_config(tokens * TOP_K, EXPERTS)
    if hopper_tiles:  # the 128 x 256 tiles of large 16-bit batches on Hopper, over float32 data
        config = moe.gemm_config(24576, 64, False, LARGE_SHARED_MEMORY)
        assert config["BLOCK_N"] == 256
    block_m = config["BLOCK_M"]
    max_sorted = moe.max_sorted_entries(tokens * TOP_K, EXPERTS, block_m)
    sorted_ids = np.zeros(max_sorted, np.int32)
    block_expert = np.zeros(-(-max_sorted // block_m), np.int32)
    cursor, total = np.zeros(EXPERTS, np.int32), np.zeros(1, np.int32)
    moe.moe_align(tensor(ids), EXPERTS, block_m, *map(tensor, (sorted_ids, block_expert, cursor, total)))
    real = sorted_ids[sorted_ids < tokens * TOP_K]
    assert sorted(real.tolist()) == list(range(tokens * TOP_K))  # every entry exactly once
    counts = np.bincount(ids.reshape(-1), minlength=EXPERTS)
    assert total[0] == sum(-(-c // block_m) * block_m for c in counts)
    for block in range(total[0] // block_m):  # each tile holds one expert's entries
        entries = sorted_ids[block * block_m : (block + 1) * block_m]
        entries = entries[entries < tokens * TOP_K]
        assert (ids.reshape(-1)[entries] == block_expert[block]).all()
    handles = (tensor(sorted_ids), tensor(block_expert), tensor(total))
    gate_up = np.zeros((tokens * TOP_K, 2 * WIDTH), np.float32)
    moe.moe_gemm(tensor(x), tensor(w_gate_up), tensor(gate_up), *handles, None, TOP_K, False, config)
    gate, up = gate_up[:, :WIDTH], gate_up[:, WIDTH:]
    activated = (gate / (1 + np.exp(-gate)) * up).astype(np.float32)
    down = np.zeros((tokens * TOP_K, HIDDEN), np.float32)
    moe.moe_gemm(
        tensor(activated),
        tensor(w_down),
        tensor(down),
        *handles,
        tensor(weights.reshape(-1)),
        TOP_K,
        True,
        config,
    )
    out = down.reshape(tokens, TOP_K, HIDDEN).sum(1)
    np.testing.assert_allclose(
        out, _experts_reference(x, w_gate_up, w_down, weights, ids), rtol=1e-4, atol=1e-5
    )


def test_backend_moe_ops_on_torch_cpu_with_triton(monkeypatch):
    """What Ernie4_5_MoeForCausalLM calls: route, stacked expert weights, experts."""
    from fastdeploy.backends.conformance import build_backend

    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    backend = build_backend("torch-cpu", threads=1)
    rng = np.random.default_rng(4)
    gate = [(rng.standard_normal((WIDTH, HIDDEN)) * 0.2).astype(np.float32) for _ in range(EXPERTS)]
    up = [(rng.standard_normal((WIDTH, HIDDEN)) * 0.2).astype(np.float32) for _ in range(EXPERTS)]
    down = [(rng.standard_normal((HIDDEN, WIDTH)) * 0.2).astype(np.float32) for _ in range(EXPERTS)]
    x = rng.standard_normal((9, HIDDEN)).astype(np.float32)
    logits = rng.standard_normal((9, EXPERTS)).astype(np.float32)
    bias = (rng.standard_normal(EXPERTS) * 0.3).astype(np.float32)
    experts = backend.moe_expert_weights(gate, up, down)
    weights, ids = backend.moe_route(backend.from_numpy(logits), TOP_K, backend.from_numpy(bias), True, 1e-12)
    out = backend.to_numpy(backend.moe_experts(backend.from_numpy(x), experts, weights, ids))
    expected_weights, expected_ids = _route_reference(logits, bias, TOP_K)
    w_gate_up = np.stack([np.concatenate([g, u]).T for g, u in zip(gate, up, strict=True)])
    w_down = np.stack([d.T for d in down])
    expected = _experts_reference(x, w_gate_up, w_down, expected_weights, expected_ids)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_expert_parallel_ranks_sum_to_the_whole_layer(monkeypatch):
    """Under expert parallelism each rank holds a slice of the experts (`first_expert`), adds
    nothing for entries routed elsewhere, and the ranks' sum is the whole layer."""
    from fastdeploy.backends.conformance import build_backend

    monkeypatch.setenv("FD_CUDA_KERNELS", "triton")
    backend = build_backend("torch-cpu", threads=1)
    rng = np.random.default_rng(5)
    gate = [(rng.standard_normal((WIDTH, HIDDEN)) * 0.2).astype(np.float32) for _ in range(EXPERTS)]
    up = [(rng.standard_normal((WIDTH, HIDDEN)) * 0.2).astype(np.float32) for _ in range(EXPERTS)]
    down = [(rng.standard_normal((HIDDEN, WIDTH)) * 0.2).astype(np.float32) for _ in range(EXPERTS)]
    x = rng.standard_normal((7, HIDDEN)).astype(np.float32)
    ids = rng.integers(0, EXPERTS, (7, TOP_K)).astype(np.int32)
    weights = rng.random((7, TOP_K)).astype(np.float32)
    half = EXPERTS // 2
    out = np.zeros((7, HIDDEN))
    for first in (0, half):
        shard = slice(first, first + half)
        experts = backend.moe_expert_weights(gate[shard], up[shard], down[shard])
        out += backend.to_numpy(
            backend.moe_experts(
                backend.from_numpy(x), experts, tensor(weights), tensor(ids), first_expert=first
            )
        )
    w_gate_up = np.stack([np.concatenate([g, u]).T for g, u in zip(gate, up, strict=True)])
    w_down = np.stack([d.T for d in down])
    expected = _experts_reference(x, w_gate_up, w_down, weights, ids)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
