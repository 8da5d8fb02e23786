"""Element-wise Triton kernels of the cuda backend: fused RMSNorm, rotary, KV writes, SwiGLU.

Attention, sampling and MoE have their own modules (`triton_attention`, `triton_sampling`,
`triton_moe`).

The kernels take contiguous tensors (paddle tensors on a GPU, through paddle's torch-compat proxy
for triton; torch tensors under `TRITON_INTERPRET=1` on a CPU, which is how the tests run them)
and compute in float32 whatever the storage dtype. Each launcher documents shapes; outputs are
allocated by the caller so these modules never depend on a tensor library.

`TRITON_INTERPRET` is read by `triton.jit` when this module is imported: set it first.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offsets = row * n_cols + cols
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(residual_out_ptr + offsets, x.to(residual_out_ptr.dtype.element_ty), mask=mask)
    variance = tl.sum(x * x, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(variance + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, (x * rstd * weight).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: Any, weight: Any, eps: float, residual: Any, out: Any, residual_out: Any) -> None:
    """out = RMSNorm(x + residual) * weight; residual_out = x + residual (x, out: [rows, hidden]).

    With `residual` None, `residual_out` is not written (the caller's new residual is x itself).
    """
    rows, hidden = x.shape
    _rms_norm_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        residual_out if residual is not None else out,
        hidden,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(hidden),
    )


@triton.jit
def _rotary_kernel(
    x_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    x_token_stride,
    num_heads,
    head_dim,
    half,
    HEADS_BLOCK: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
    TAIL_BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    i = tl.arange(0, HALF_BLOCK)
    heads = tl.arange(0, HEADS_BLOCK)[:, None]
    cos = tl.load(cos_ptr + position * half + i, mask=i < half, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + position * half + i, mask=i < half, other=0.0).to(tl.float32)[None, :]
    mask = (heads < num_heads) & (i[None, :] < half)
    source = x_ptr + token * x_token_stride + heads * head_dim
    target = out_ptr + token * num_heads * head_dim + heads * head_dim
    first = tl.load(source + i[None, :], mask=mask, other=0.0).to(tl.float32)
    second = tl.load(source + half + i[None, :], mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(target + i[None, :], (first * cos - second * sin).to(dtype), mask=mask)
    tl.store(target + half + i[None, :], (second * cos + first * sin).to(dtype), mask=mask)
    if TAIL_BLOCK > 0:  # partial rotary: dimensions past 2 * half pass through
        j = 2 * half + tl.arange(0, TAIL_BLOCK)[None, :]
        tail_mask = (heads < num_heads) & (j < head_dim)
        tl.store(target + j, tl.load(source + j, mask=tail_mask), mask=tail_mask)


def rotary_embedding(x: Any, positions: Any, cos: Any, sin: Any, out: Any, x_token_stride: int) -> None:
    """Rotate-half rotary of x [tokens, heads, head_dim] at `positions` into out (contiguous).

    x's heads and dimensions are dense; its tokens are `x_token_stride` elements apart (q and k
    are read in place from the fused qkv projection). One program rotates every head of a token.
    cos/sin are [max_positions, rotary_dim / 2] tables; dimensions past rotary_dim are copied.
    """
    tokens, heads, head_dim = x.shape
    half = cos.shape[-1]
    tail = head_dim - 2 * half
    if tokens == 0:
        return
    _rotary_kernel[(tokens,)](
        x,
        positions,
        cos,
        sin,
        out,
        x_token_stride,
        heads,
        head_dim,
        half,
        HEADS_BLOCK=triton.next_power_of_2(heads),
        HALF_BLOCK=triton.next_power_of_2(half),
        TAIL_BLOCK=triton.next_power_of_2(tail) if tail > 0 else 0,
    )


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    row_size,
    value_token_stride,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding rows of a CUDA-graph batch write nothing
        return
    for start in range(0, row_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < row_size
        key = tl.load(key_ptr + token * row_size + cols, mask=mask)
        value = tl.load(value_ptr + token * value_token_stride + cols, mask=mask)
        tl.store(key_cache_ptr + slot * row_size + cols, key, mask=mask)
        tl.store(value_cache_ptr + slot * row_size + cols, value, mask=mask)


def store_kv(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    value_token_stride: int | None = None,
) -> None:
    """key/value [tokens, kv_heads, head_dim] into caches [slots, kv_heads, head_dim] at slot_mapping
    (int64; a negative slot skips its token). key is contiguous; value's tokens may be
    `value_token_stride` elements apart (read in place from the fused qkv projection)."""
    tokens = key.shape[0]
    row_size = key.shape[1] * key.shape[2]
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        row_size,
        row_size if value_token_stride is None else value_token_stride,
        BLOCK=min(triton.next_power_of_2(row_size), 1024),
    )


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * 2 * width + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * width + width + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * width + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: Any, out: Any) -> None:
    """out [rows, d] = silu(x[:, :d]) * x[:, d:] for x [rows, 2d]."""
    rows, width = out.shape
    if rows == 0:
        return
    block = min(triton.next_power_of_2(width), 1024)
    _silu_and_mul_kernel[(rows, triton.cdiv(width, block))](x, out, width, BLOCK=block)
