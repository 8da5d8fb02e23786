"""The portable defaults of the optional capabilities: host implementations over the ops part.

`Backend` runs these where a backend does not declare the capability (logging once that it
does, see `capabilities.note_fallback`); they are correct everywhere and slow on accelerators,
since most copy device arrays to the host (`to_numpy`) and back (`from_numpy`). Each is the
reference a declaring backend must match.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdeploy.backends.ops import DeviceOps
from fastdeploy.backends.types import PendingTokens


def apply_token_bitmask_numpy(logits: np.ndarray, bitmask: np.ndarray, rows: np.ndarray) -> None:
    """In place: `logits[rows[i], t] = -inf` wherever bit t of `bitmask[i]` is 0 (host reference).

    `bitmask` is int32 [len(rows), ceil(vocab / 32)], bits packed little-endian: token t is
    allowed when bit `t % 32` of word `t // 32` is set.
    """
    vocab = logits.shape[-1]
    packed = np.ascontiguousarray(bitmask, dtype=np.int32).view(np.uint8)
    allowed = np.unpackbits(packed, axis=-1, bitorder="little")[:, :vocab].astype(bool)
    for row, keep in zip(rows.tolist(), allowed, strict=True):
        np.copyto(logits[row], -np.inf, where=~keep)


def argmax_rows(ops: DeviceOps, logits: Any) -> np.ndarray:
    """The host default of `Backend.argmax_rows`."""
    return np.asarray(ops.to_numpy(logits)).argmax(axis=-1).astype(np.int64)


def moe_route(
    ops: DeviceOps,
    router_logits: Any,
    top_k: int,
    correction_bias: Any | None = None,
    renormalize: bool = True,
    norm_min: float = 0.0,
) -> tuple[Any, Any]:
    """The host default of `Backend.moe_route`."""
    logits = np.asarray(ops.to_numpy(router_logits), dtype=np.float32)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    scores = probs
    if correction_bias is not None:
        scores = probs + np.asarray(ops.to_numpy(correction_bias), dtype=np.float32).reshape(1, -1)
    ids = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if renormalize:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(norm_min))
    return ops.from_numpy(weights.astype(np.float32)), ops.from_numpy(ids.astype(np.int64))


def moe_expert_weights(
    ops: DeviceOps, gate: list[np.ndarray], up: list[np.ndarray], down: list[np.ndarray]
) -> Any:
    """The host default of `Backend.moe_expert_weights`."""
    return [(ops.linear_weight(g, u), ops.linear_weight(d)) for g, u, d in zip(gate, up, down, strict=True)]


def moe_experts(
    ops: DeviceOps, x: Any, experts: Any, topk_weights: Any, topk_ids: Any, first_expert: int = 0
) -> Any:
    """The host default of `Backend.moe_experts`."""
    ids = np.asarray(ops.to_numpy(topk_ids), dtype=np.int64) - first_expert
    weights = np.asarray(ops.to_numpy(topk_weights), dtype=np.float32).reshape(-1)
    top_k = ids.shape[1]
    flat = ids.reshape(-1)
    flat = np.where((flat >= 0) & (flat < len(experts)), flat, len(experts))  # others: one bin past the end
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=len(experts) + 1)[: len(experts)]
    result: np.ndarray | None = None
    start = 0
    for expert in np.flatnonzero(counts):
        end = start + int(counts[expert])
        picks = order[start:end]
        rows = picks // top_k
        gate_up, down = experts[expert]
        hidden = ops.linear(
            ops.silu_and_mul(ops.linear(ops.gather_rows(x, ops.from_numpy(rows)), gate_up)), down
        )
        contribution = ops.to_numpy(hidden) * weights[picks][:, None]
        if result is None:
            result = np.zeros((ids.shape[0], contribution.shape[1]), dtype=np.float32)
        np.add.at(result, rows, contribution)
        start = end
    if result is None:  # no token chose these experts
        result = np.zeros(ops.to_numpy(x).shape, dtype=np.float32)
    return ops.from_numpy(result)


def apply_token_bitmask(ops: DeviceOps, logits: Any, bitmask: np.ndarray, rows: np.ndarray) -> Any:
    """The host default of `Backend.apply_token_bitmask`."""
    host = np.array(ops.to_numpy(logits), dtype=np.float32)
    apply_token_bitmask_numpy(host, bitmask, rows)
    return ops.from_numpy(host)


def encoder_attention(ops: DeviceOps, q: Any, k: Any, v: Any, cu_seqlens: np.ndarray, scale: float) -> Any:
    """The host default of `Backend.encoder_attention`."""
    qs, ks, vs = (np.asarray(ops.to_numpy(t), dtype=np.float32) for t in (q, k, v))
    out = np.empty_like(qs)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        qh, kh, vh = (t[start:end].transpose(1, 0, 2) for t in (qs, ks, vs))
        scores = (qh @ kh.transpose(0, 2, 1)) * np.float32(scale)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        out[start:end] = (scores @ vh).transpose(1, 0, 2)
    return ops.from_numpy(out)


def encoder_attention_qkv(
    ops: Any, qkv: Any, cos: Any, sin: Any, cu_seqlens: np.ndarray, heads: int, scale: float
) -> Any:
    """The host default of `Backend.encoder_attention_qkv`."""
    rows, width = qkv.shape
    if width % (3 * heads):
        raise ValueError(f"qkv's width {width} is not 3 x heads ({heads}) x head_dim")
    hidden = width // 3
    qk = qkv[:, : 2 * hidden].reshape(rows, 2 * heads, hidden // heads)
    qk = ops.rotary_embedding(qk, ops.from_numpy(np.arange(rows, dtype=np.int64)), cos, sin)
    v = qkv[:, 2 * hidden :].reshape(rows, heads, hidden // heads)
    out = ops.encoder_attention(qk[:, :heads], qk[:, heads:], v, cu_seqlens, scale)
    return out.reshape(rows, hidden)


def quick_gelu(ops: DeviceOps, x: Any) -> Any:
    """The host default of `Backend.quick_gelu`."""
    h = np.asarray(ops.to_numpy(x), dtype=np.float32)
    return ops.from_numpy(h / (np.float32(1.0) + np.exp(np.float32(-1.702) * h)))


def gelu(ops: DeviceOps, x: Any) -> Any:
    """The host default of `Backend.gelu`."""
    h = np.asarray(ops.to_numpy(x), dtype=np.float64)
    z = np.abs(h) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(h) * (1.0 - poly * np.exp(-z * z))
    return ops.from_numpy((0.5 * h * (1.0 + erf)).astype(np.float32))


def merge_rows(ops: DeviceOps, parts: list[tuple[Any, np.ndarray]], num_rows: int) -> Any:
    """The host default of `Backend.merge_rows`."""
    first = np.asarray(ops.to_numpy(parts[0][0]))
    out = np.empty((num_rows, *first.shape[1:]), dtype=first.dtype)
    for rows, indices in parts:
        out[indices] = ops.to_numpy(rows)
    return ops.from_numpy(out)


def nonfinite_rows(ops: DeviceOps, logits: Any) -> np.ndarray:
    """The host default of `Backend.nonfinite_rows`."""
    return ~np.isfinite(ops.to_numpy(logits).max(axis=-1))


def greedy_tokens(ops: Any, logits: Any) -> PendingTokens:
    """The host default of `Backend.greedy_tokens`."""
    tokens = np.asarray(ops.argmax_rows(logits), dtype=np.int64)
    nonfinite = np.asarray(ops.nonfinite_rows(logits), dtype=bool)
    return PendingTokens(ops.from_numpy(tokens), lambda: (tokens, nonfinite))


def feed_tokens(
    ops: DeviceOps, input_ids: np.ndarray, rows: np.ndarray, pending: PendingTokens, sources: np.ndarray
) -> Any:
    """The host default of `Backend.feed_tokens`."""
    ids = np.array(input_ids, dtype=np.int64)
    ids[rows] = np.asarray(ops.to_numpy(pending.device), dtype=np.int64)[sources]
    return ops.from_numpy(ids)
