"""Straightforward float64 numpy definitions of every backend op and of a whole Llama forward.

Written for clarity, one head and one token at a time where that is clearer; the conformance
checks compare backends against these, never against another backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    centered = x - x.mean(axis=-1, keepdims=True)
    out = centered / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + eps) * weight
    return out + bias if bias is not None else out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """x * Phi(x) with the exact error function."""
    erf = np.vectorize(math.erf)
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def quick_gelu(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / (1.0 + np.exp(-1.702 * x))


def segment_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bounds: list[int], scale: float
) -> np.ndarray:
    """Bidirectional attention inside each segment bounds[i]:bounds[i+1], one head at a time."""
    out = np.zeros(q.shape, dtype=np.float64)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        for h in range(q.shape[1]):
            for t in range(start, end):
                scores = k[start:end, h].astype(np.float64) @ q[t, h] * scale
                weights = np.exp(scores - scores.max())
                out[t, h] = (weights / weights.sum()) @ v[start:end, h]
    return out


def silu_and_mul(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    gate, up = x[:, :half].astype(np.float64), x[:, half:]
    return gate / (1.0 + np.exp(-gate)) * up


def rotary(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate-half rotary on the first 2 * len(inv_freq) dims, pair (i, i + half) at a time."""
    out = x.astype(np.float64).copy()
    half = inv_freq.size
    for t, position in enumerate(positions):
        for i in range(half):
            c, s = np.cos(position * inv_freq[i]), np.sin(position * inv_freq[i])
            a, b = x[t, :, i].astype(np.float64), x[t, :, i + half].astype(np.float64)
            out[t, :, i] = a * c - b * s
            out[t, :, i + half] = b * c + a * s
    return out


def causal_attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    scale: float,
    sinks: np.ndarray | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> np.ndarray:
    """The last len(q) positions of a sequence attending to all its keys (to the last `window`
    of them where `window` > 0), one head at a time; `sinks[h]` (attention sinks) is one more
    logit in head h's softmax that weighs no value; `softcap` > 0 caps the scores at
    softcap * tanh(score / softcap) (Gemma 2)."""
    length, heads, _ = q.shape
    context, kv_heads, _ = keys.shape
    group = heads // kv_heads
    out = np.zeros((length, heads, values.shape[-1]), dtype=np.float64)
    for t in range(length):
        position = context - length + t
        first = max(0, position + 1 - window) if window > 0 else 0
        for h in range(heads):
            kh = h // group
            scores = keys[first : position + 1, kh].astype(np.float64) @ q[t, h] * scale
            if softcap > 0:
                scores = softcap * np.tanh(scores / softcap)
            top = scores.max() if sinks is None else max(scores.max(), float(sinks[h]))
            weights = np.exp(scores - top)
            denominator = weights.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - top))
            out[t, h] = (weights / denominator) @ values[first : position + 1, kh]
    return out


def latent_attention(
    q_nope: np.ndarray,
    q_rope: np.ndarray,
    latent: np.ndarray,
    k_rope: np.ndarray,
    absorb_k: np.ndarray,
    absorb_v: np.ndarray,
    scale: float,
) -> np.ndarray:
    """Multi-head latent attention of the last len(q) positions of a sequence, with every head's
    keys (latent @ absorb_k[h].T, k_rope) and values (latent @ absorb_v[h].T) formed explicitly."""
    context, heads = latent.shape[0], absorb_k.shape[0]
    keys_nope = np.einsum("cl,hnl->chn", latent.astype(np.float64), absorb_k)
    shared = np.broadcast_to(k_rope[:, None, :], (context, heads, k_rope.shape[1]))
    keys = np.concatenate([keys_nope, shared], axis=-1)
    values = np.einsum("cl,hvl->chv", latent.astype(np.float64), absorb_v)
    return causal_attention(np.concatenate([q_nope, q_rope], axis=-1), keys, values, scale)


def sample_top_k_top_p(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, uniform: float
) -> int:
    """Top-k, then top-p on the renormalised mass (sorted), then inverse CDF in vocabulary order."""
    x = logits.astype(np.float64) / temperature
    vocab = x.size
    keep = np.ones(vocab, dtype=bool)
    if 0 < top_k < vocab:
        keep &= x >= np.sort(x)[::-1][top_k - 1]
    probs = np.where(keep, np.exp(x - x.max()), 0.0)
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order]) / probs.sum()
        cut = int(np.searchsorted(cumulative, top_p)) + 1
        nucleus = np.zeros(vocab, dtype=bool)
        nucleus[order[:cut]] = True
        keep &= nucleus
    cumulative = np.cumsum(np.where(keep, probs, 0.0))
    return int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))


def moe_route(
    logits: np.ndarray, top_k: int, bias: np.ndarray | None, renormalize: bool, norm_min: float
) -> tuple[np.ndarray, np.ndarray]:
    """(weights, expert ids) [tokens, top_k]: experts ranked by softmax probability + bias, one
    token at a time, weighted by the unbiased probabilities (renormalised over the chosen ones)."""
    weights = np.zeros((logits.shape[0], top_k))
    ids = np.zeros((logits.shape[0], top_k), dtype=np.int64)
    for t, row in enumerate(logits.astype(np.float64)):
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        scores = probs + (bias if bias is not None else 0.0)
        chosen = sorted(range(row.size), key=lambda e: -scores[e])[:top_k]
        ids[t] = chosen
        weights[t] = probs[chosen]
        if renormalize:
            weights[t] /= max(weights[t].sum(), norm_min)
    return weights, ids


def moe_experts(
    x: np.ndarray,
    gate: list[np.ndarray],
    up: list[np.ndarray],
    down: list[np.ndarray],
    weights: np.ndarray,
    ids: np.ndarray,
    first_expert: int = 0,
) -> np.ndarray:
    """Per token, the weighted sum of its routed SwiGLU experts; experts outside
    `first_expert .. first_expert + len(gate)` add nothing."""
    out = np.zeros(x.shape, dtype=np.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k]) - first_expert
            if 0 <= e < len(gate):
                g, u = gate[e] @ x[t].astype(np.float64), up[e] @ x[t].astype(np.float64)
                out[t] += weights[t, k] * (down[e] @ (g / (1.0 + np.exp(-g)) * u))
    return out


def decoder_layer(
    x: np.ndarray, layer: dict[str, Any], positions: np.ndarray, inv_freq: np.ndarray
) -> np.ndarray:
    """One Llama decoder layer over a whole prompt (no cache) on the residual stream x [tokens,
    hidden]; `layer` holds "input_norm", "qkv" [rows, hidden], optional "qkv_bias", optional
    per-head "q_norm"/"k_norm", optional per-head attention "sinks", "o_proj", "post_norm",
    "gate_up" (gate rows first), "down", "heads", "kv_heads", "head_dim", "eps"."""
    heads, kv_heads, dim, eps = layer["heads"], layer["kv_heads"], layer["head_dim"], layer["eps"]
    tokens = x.shape[0]
    qkv = rms_norm(x, layer["input_norm"], eps) @ layer["qkv"].T + layer.get("qkv_bias", 0.0)
    q = qkv[:, : heads * dim].reshape(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].reshape(tokens, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].reshape(tokens, kv_heads, dim)
    if "q_norm" in layer:
        q, k = rms_norm(q, layer["q_norm"], eps), rms_norm(k, layer["k_norm"], eps)
    q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
    attended = causal_attention(q, k, v, layer["scale"], layer.get("sinks"))
    x = x + attended.reshape(tokens, -1) @ layer["o_proj"].T
    up = silu_and_mul(rms_norm(x, layer["post_norm"], eps) @ layer["gate_up"].T)
    return x + up @ layer["down"].T


def int8_activation_product(
    x: np.ndarray, levels: np.ndarray, scales: np.ndarray, group: int = 128
) -> np.ndarray:
    """x [tokens, in] times int8 weight `levels` [out, in] with a scale per output channel, the
    activations quantised per row and `group` inputs as the cpu backend's W8A8 kernels promise:
    scale max|x| / 127, levels round(x * 127 / max|x|) to nearest even (in float32, as x arrives)."""
    x32 = np.asarray(x, dtype=np.float32)
    out = np.zeros((x32.shape[0], levels.shape[0]))
    for start in range(0, x32.shape[1], group):
        block = x32[:, start : start + group]
        peak = np.abs(block).max(axis=1, keepdims=True)
        inverse = np.divide(np.float32(127), peak, out=np.zeros_like(peak), where=peak > 0)
        q = np.clip(np.rint(block * inverse), -127, 127).astype(np.int64)
        dots = q @ levels[:, start : start + group].astype(np.int64).T
        out += (peak / np.float32(127)).astype(np.float64) * dots
    return out * np.asarray(scales, dtype=np.float64)[None, :]


def llama_logits(
    weights: dict[str, np.ndarray],
    config: dict[str, Any],
    token_ids: list[int],
    product: Callable[[np.ndarray, str], np.ndarray] | None = None,
) -> np.ndarray:
    """Logits of every position of `token_ids` under a HF-named Llama checkpoint, no cache.

    `partial_rotary_factor` in `config` (default 1) rotates only that fraction of each head.
    `product(h, name)` replaces `h @ weights[name].T` for the linear layers and the tied head
    (a quantised product's numerics, say).
    """
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = hidden // heads
    eps = config["rms_norm_eps"]
    rotary_dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / config["rope_theta"] ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    positions = np.arange(len(token_ids))
    w = {name: value.astype(np.float64) for name, value in weights.items()}

    def float_product(h: np.ndarray, name: str) -> np.ndarray:
        return h @ w[name].T

    product = product or float_product
    x = w["model.embed_tokens.weight"][token_ids]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = product(h, p + "self_attn.q_proj.weight").reshape(-1, heads, head_dim)
        k = product(h, p + "self_attn.k_proj.weight").reshape(-1, kv_heads, head_dim)
        v = product(h, p + "self_attn.v_proj.weight").reshape(-1, kv_heads, head_dim)
        q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        attn = causal_attention(q, k, v, head_dim**-0.5).reshape(-1, hidden)
        x = x + product(attn, p + "self_attn.o_proj.weight")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = product(h, p + "mlp.gate_proj.weight")
        up = product(h, p + "mlp.up_proj.weight")
        x = x + product(gate / (1.0 + np.exp(-gate)) * up, p + "mlp.down_proj.weight")
    x = rms_norm(x, w["model.norm.weight"], eps)
    return product(x, "model.embed_tokens.weight")  # tied embeddings


def greedy_tokens(logits_fn: Any, prompt: list[int], count: int) -> list[int]:
    """Greedy continuation by full recomputation (no KV cache): `count` new tokens."""
    tokens = list(prompt)
    for _ in range(count):
        tokens.append(int(np.argmax(logits_fn(tokens)[-1])))
    return tokens[len(prompt) :]
