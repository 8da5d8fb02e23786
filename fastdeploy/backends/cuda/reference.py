"""Reference implementations of the custom kernels with plain framework ops (through the runtime).

They run on any place of either runtime (Paddle's CPU build has no fused RMSNorm, rotary or
block-attention kernels that work here: `fused_rms_norm` dies with an illegal instruction on
this CPU), define what the Triton kernels must compute, and are what the backend uses on a CPU
place, or where Triton is unavailable.
Attention follows the cpu backend: decode sequences batched over a padded gather of their
cache slots, prefill chunks one sequence at a time in query tiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_PREFILL_QUERY_TILE = 256


@dataclass
class PrefillTile:
    """Query rows [start, end) of one sequence, its context slots and the causal mask."""

    start: int
    end: int
    slots: Any  # [context] int64 tensor
    mask: Any  # [end - start, context] float tensor, 0 or -inf


@dataclass
class ReferenceAttentionMetadata:
    decode_rows: Any  # [decodes] int64 tensor (None when there are no decodes)
    decode_slots: Any  # [decodes * max_context] int64 tensor
    decode_mask: Any  # [decodes, 1, 1, max_context] float tensor
    decode_width: int
    prefill_tiles: list[PrefillTile]


def build_reference_metadata(rt: Any, dtype: str, host: Any) -> ReferenceAttentionMetadata:
    """Device copies of the cpu backend's host-side split (`cpu.attention.build_metadata`)."""

    def tensor(array: np.ndarray, kind: str | None = None) -> Any:
        return rt.from_numpy(np.ascontiguousarray(array), kind)

    decodes = host.decode_rows.size
    tiles = []
    for piece in host.prefills:
        slots = tensor(piece.slots)
        first_position = piece.context_len - (piece.token_end - piece.token_start)
        for start in range(piece.token_start, piece.token_end, _PREFILL_QUERY_TILE):
            end = min(start + _PREFILL_QUERY_TILE, piece.token_end)
            positions = first_position + (start - piece.token_start) + np.arange(end - start)
            future = np.arange(piece.context_len)[None, :] > positions[:, None]
            mask = np.where(future, np.float32(-np.inf), np.float32(0)).astype(np.float32)
            tiles.append(PrefillTile(start, end, slots, tensor(mask, dtype)))
    return ReferenceAttentionMetadata(
        decode_rows=tensor(host.decode_rows) if decodes else None,
        decode_slots=tensor(host.decode_slots.reshape(-1)) if decodes else None,
        decode_mask=tensor(host.decode_mask, dtype) if decodes else None,
        decode_width=int(host.decode_slots.shape[1]) if decodes else 0,
        prefill_tiles=tiles,
    )


def store_kv(rt: Any, k: Any, v: Any, key_cache: Any, value_cache: Any, slot_mapping: Any) -> None:
    """Write this step's keys and values into their cache slots, in place."""
    rt.index_copy_(key_cache, slot_mapping, k)
    rt.index_copy_(value_cache, slot_mapping, v)


def paged_attention(
    rt: Any,
    q: Any,
    kv_cache: tuple[Any, Any],
    meta: ReferenceAttentionMetadata,
    scale: float,
) -> Any:
    """Causal attention of q [tokens, heads, head_dim] over caches [slots, kv_heads, head_dim]."""
    key_cache, value_cache = kv_cache
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = key_cache.shape[1]
    group = num_heads // num_kv_heads
    out = rt.zeros(list(q.shape), rt.dtype_name(q))
    if meta.decode_rows is not None:
        count, width = meta.decode_rows.shape[0], meta.decode_width
        queries = rt.index_select(q, meta.decode_rows).reshape([count, num_kv_heads, group, head_dim])
        keys = rt.index_select(key_cache, meta.decode_slots).reshape([count, width, num_kv_heads, head_dim])
        values = rt.index_select(value_cache, meta.decode_slots).reshape(
            [count, width, num_kv_heads, head_dim]
        )
        scores = rt.matmul(queries * scale, rt.permute(keys, [0, 2, 3, 1])) + meta.decode_mask
        result = rt.matmul(rt.softmax(scores, -1), rt.permute(values, [0, 2, 1, 3]))
        rt.index_copy_(out, meta.decode_rows, result.reshape([count, num_heads, head_dim]))
    for tile in meta.prefill_tiles:
        length = tile.end - tile.start
        keys = rt.permute(rt.index_select(key_cache, tile.slots), [1, 2, 0])  # [kvh, hd, ctx]
        values = rt.permute(rt.index_select(value_cache, tile.slots), [1, 0, 2])  # [kvh, ctx, hd]
        queries = (q[tile.start : tile.end] * scale).reshape([length, num_kv_heads, group, head_dim])
        scores = rt.matmul(rt.permute(queries, [1, 2, 0, 3]), keys.reshape([num_kv_heads, 1, head_dim, -1]))
        weights = rt.softmax(scores + tile.mask, -1)
        result = rt.matmul(weights, values.reshape([num_kv_heads, 1, -1, head_dim]))  # [kvh, g, L, hd]
        out[tile.start : tile.end] = rt.permute(result, [2, 0, 1, 3]).reshape([length, num_heads, head_dim])
    return out


def rms_norm(rt: Any, x: Any, weight: Any, eps: float, residual: Any | None) -> tuple[Any, Any]:
    """RMSNorm of (x + residual) computed in float32; (normed, new residual)."""
    if residual is not None:
        x = x + residual
    x32 = rt.cast(x, "float32")
    variance = rt.sum_rows(x32 * x32, -1).reshape([-1, 1]) * (1.0 / x.shape[-1])
    normed = x32 * rt.rsqrt(variance + eps) * rt.cast(weight, "float32")
    return rt.cast(normed, rt.dtype_name(x)), x


def rotary_embedding(rt: Any, x: Any, positions: Any, cos: Any, sin: Any) -> Any:
    """Rotate-half rotary of x [tokens, heads, head_dim]; dims past the table's rotary_dim pass."""
    half = cos.shape[-1]
    tokens = positions.shape[0]
    cos_rows = rt.index_select(cos, positions).reshape([tokens, 1, half])
    sin_rows = rt.index_select(sin, positions).reshape([tokens, 1, half])
    first, second = x[..., :half], x[..., half : 2 * half]
    parts = [first * cos_rows - second * sin_rows, second * cos_rows + first * sin_rows]
    if 2 * half < x.shape[-1]:
        parts.append(x[..., 2 * half :])
    return rt.concat(parts, -1)
