"""Fused decoder-layer ops (`Capability.FUSED_DECODER_LAYERS`): their data and portable default.

A decoder layer of the Llama family (Llama, Qwen2/3, ERNIE-4.5 and its VL model) is an attention
half and a SwiGLU half. The models hand both halves to the backend as data (`AttentionBlock`,
`MLPBlock`), so a backend that fuses them (the cpu backend: one native call for a whole run of
layers) speeds up every such model at once. Model-specific parts are options of the data, not
methods of the contract: Qwen3's per-head q/k RMSNorm is `AttentionBlock.q_norm` / `k_norm`.

The functions here are the portable default, built from the generic ops of `DeviceOps` only;
`Backend` runs them where a backend does not declare the capability, and a backend that fuses
must give the same results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fastdeploy.backends.lora import LayerLoRA
from fastdeploy.backends.ops import DeviceOps


@dataclass(eq=False)
class AttentionBlock:
    """A decoder layer's attention half, computed by `Backend.attention_block`: RMSNorm of
    (x + residual), the fused q/k/v projection, per-head q/k RMSNorm where given (Qwen3), the
    rotate-half rotary embedding, paged attention, the output projection.

    Weights are this backend's arrays (`linear_weight`, `linear_bias`, `from_numpy`). `qkv`
    stacks the rows of the q heads, then the k heads, then the v heads (`num_heads` and
    `num_kv_heads` of this rank); the q and k rows are in the rotate-half layout.
    """

    input_norm: Any
    qkv: Any
    o_proj: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    #: of the input RMSNorm and the per-head q/k norms
    eps: float
    #: attention softmax scale (usually head_dim ** -0.5)
    scale: float
    qkv_bias: Any | None = None
    o_bias: Any | None = None
    #: per-head RMSNorm weights [head_dim] of queries and keys, applied before rotary (both or neither)
    q_norm: Any | None = None
    k_norm: Any | None = None
    #: sliding window: each query sees only its last `window` positions (0: all; a backend that
    #: fuses reads it only when it declares `Capability.SLIDING_WINDOW`)
    window: int = 0
    #: attention logit soft-capping: scores become softcap * tanh(score / softcap) before the
    #: softmax (0: none; Gemma 2; set only on a backend that declares `Capability.ATTENTION_SOFTCAP`)
    softcap: float = 0.0
    #: the backend's own form of the block (e.g. its kernels' arguments), made at first use
    prepared: Any = field(default=None, repr=False, compare=False)


@dataclass(eq=False)
class MLPBlock:
    """A decoder layer's SwiGLU half, computed by `Backend.mlp_block`: RMSNorm of (x + residual),
    the fused gate/up projection (gate rows first), silu(gate) * up, the down projection."""

    norm: Any
    gate_up: Any
    down: Any
    eps: float
    gate_up_bias: Any | None = None
    down_bias: Any | None = None
    #: the backend's own form of the block (e.g. its kernels' arguments), made at first use
    prepared: Any = field(default=None, repr=False, compare=False)


def attention_block(
    ops: DeviceOps,
    x: Any,
    residual: Any | None,
    block: AttentionBlock,
    positions: Any,
    cos: Any,
    sin: Any,
    batch: Any,
    kv_cache: Any,
    lora: LayerLoRA | None = None,
) -> tuple[Any, Any]:
    """`Backend.attention_block` from the ops one by one; with `lora`, each row's adapter adds
    its low-rank products to the q/k/v and output projections (`Backend.add_lora`)."""
    normed, residual = ops.rms_norm(x, block.input_norm, block.eps, residual)
    qkv = ops.linear(normed, block.qkv, block.qkv_bias)
    if lora is not None:
        qkv = lora.add(ops, "qkv", qkv, normed)
    tokens, dim = qkv.shape[0], block.head_dim
    q_size, kv_size = block.num_heads * dim, block.num_kv_heads * dim
    q = qkv[:, :q_size].reshape(tokens, block.num_heads, dim)
    k = qkv[:, q_size : q_size + kv_size].reshape(tokens, block.num_kv_heads, dim)
    v = qkv[:, q_size + kv_size :].reshape(tokens, block.num_kv_heads, dim)
    if block.q_norm is not None:
        q = ops.rms_norm(q.reshape(-1, dim), block.q_norm, block.eps)[0].reshape(tokens, -1, dim)
        k = ops.rms_norm(k.reshape(-1, dim), block.k_norm, block.eps)[0].reshape(tokens, -1, dim)
    q = ops.rotary_embedding(q, positions, cos, sin)
    k = ops.rotary_embedding(k, positions, cos, sin)
    if block.softcap:
        out = ops.softcapped_attention(q, k, v, kv_cache, batch, block.scale, block.softcap, block.window)
    elif block.window:
        out = ops.windowed_attention(q, k, v, kv_cache, batch, block.scale, block.window)
    else:
        out = ops.attention(q, k, v, kv_cache, batch, block.scale)
    out = out.reshape(tokens, q_size)
    projected = ops.linear(out, block.o_proj, block.o_bias)
    return (projected if lora is None else lora.add(ops, "o_proj", projected, out)), residual


def mlp_block(
    ops: DeviceOps, x: Any, residual: Any | None, block: MLPBlock, lora: LayerLoRA | None = None
) -> tuple[Any, Any]:
    """`Backend.mlp_block` from the ops one by one (with `lora`: adapters on gate/up and down)."""
    normed, residual = ops.rms_norm(x, block.norm, block.eps, residual)
    gate_up = ops.linear(normed, block.gate_up, block.gate_up_bias)
    if lora is not None:
        gate_up = lora.add(ops, "gate_up", gate_up, normed)
    up = ops.silu_and_mul(gate_up)
    down = ops.linear(up, block.down, block.down_bias)
    return (down if lora is None else lora.add(ops, "down", down, up)), residual


def decoder_layers(
    backend: Any,
    x: Any,
    residual: Any | None,
    layers: Sequence[tuple[AttentionBlock, MLPBlock]],
    positions: Any,
    cos: Any,
    sin: Any,
    batch: Any,
    kv_caches: Sequence[Any],
) -> tuple[Any, Any]:
    """`Backend.decoder_layers` layer by layer through the backend's own `attention_block` and
    `mlp_block` (fused or not)."""
    for (attention, mlp), kv_cache in zip(layers, kv_caches, strict=True):
        x, residual = backend.attention_block(x, residual, attention, positions, cos, sin, batch, kv_cache)
        x, residual = backend.mlp_block(x, residual, mlp)
    return x, residual
