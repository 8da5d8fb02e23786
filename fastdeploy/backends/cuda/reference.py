"""Reference implementations of the custom kernels with plain framework ops (through the runtime).

They run on any place of either runtime (Paddle's CPU build has no fused RMSNorm, rotary or
block-attention kernels that work here: `fused_rms_norm` dies with an illegal instruction on
this CPU), define what the Triton kernels must compute, and are what the backend uses on a CPU
place, or where Triton is unavailable.
Attention follows the cpu backend: decode sequences batched over a padded gather of their
cache slots, prefill chunks one sequence at a time in query tiles. A sliding window is one more
additive mask (built on the host for each window a step's layers use, then kept); attention
sinks are one more column of each softmax, dropped after it; soft-capped scores are
cap * (2 sigmoid(2 s / cap) - 1), which is cap * tanh(s / cap).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    positions: np.ndarray  # [end - start] the queries' positions (host)


@dataclass
class ReferenceAttentionMetadata:
    decode_rows: Any  # [decodes] int64 tensor (None when there are no decodes)
    decode_slots: Any  # [decodes * max_context] int64 tensor
    decode_mask: Any  # [decodes, 1, 1, max_context] float tensor
    decode_width: int
    prefill_tiles: list[PrefillTile]
    decode_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [decodes] (host)
    dtype: str = "float32"
    #: window -> (decode mask, one mask per prefill tile), built the first time a layer asks
    windowed: dict[int, tuple[Any, list[Any]]] = field(default_factory=dict)


def _causal_mask(positions: np.ndarray, context: int, window: int = 0) -> np.ndarray:
    """0 where a query at each of `positions` sees key 0 .. context - 1, -inf elsewhere."""
    keys = np.arange(context)[None, :]
    hidden = keys > positions[:, None]
    if window > 0:
        hidden |= keys <= positions[:, None] - window
    return np.where(hidden, np.float32(-np.inf), np.float32(0)).astype(np.float32)


def build_reference_metadata(rt: Any, dtype: str, host: Any) -> ReferenceAttentionMetadata:
    """Device copies of the cpu backend's host-side split (`cpu.attention.build_metadata`)."""
    decodes = host.decode_rows.size
    tiles = []
    for piece in host.prefills:
        slots = _tensor(rt, piece.slots)
        first_position = piece.context_len - (piece.token_end - piece.token_start)
        for start in range(piece.token_start, piece.token_end, _PREFILL_QUERY_TILE):
            end = min(start + _PREFILL_QUERY_TILE, piece.token_end)
            positions = first_position + (start - piece.token_start) + np.arange(end - start)
            mask = _causal_mask(positions, piece.context_len)
            tiles.append(PrefillTile(start, end, slots, _tensor(rt, mask, dtype), positions))
    return ReferenceAttentionMetadata(
        decode_rows=_tensor(rt, host.decode_rows) if decodes else None,
        decode_slots=_tensor(rt, host.decode_slots.reshape(-1)) if decodes else None,
        decode_mask=_tensor(rt, host.decode_mask, dtype) if decodes else None,
        decode_width=int(host.decode_slots.shape[1]) if decodes else 0,
        prefill_tiles=tiles,
        decode_lens=np.asarray(host.decode_lens, np.int64),
        dtype=dtype,
    )


def _tensor(rt: Any, array: np.ndarray, kind: str | None = None) -> Any:
    return rt.from_numpy(np.ascontiguousarray(array), kind)


def _masks(rt: Any, meta: ReferenceAttentionMetadata, window: int) -> tuple[Any, list[Any]]:
    """The decode mask and the prefill tiles' masks of this step, for `window` (0: causal)."""
    if window <= 0:
        return meta.decode_mask, [tile.mask for tile in meta.prefill_tiles]
    if window not in meta.windowed:
        decode_mask = None
        if meta.decode_rows is not None:
            mask = _causal_mask(meta.decode_lens - 1, meta.decode_width, window)
            decode_mask = _tensor(rt, mask[:, None, None, :], meta.dtype)
        tiles = [
            _tensor(rt, _causal_mask(tile.positions, tile.mask.shape[1], window), meta.dtype)
            for tile in meta.prefill_tiles
        ]
        meta.windowed[window] = (decode_mask, tiles)
    return meta.windowed[window]


def _capped(rt: Any, scores: Any, softcap: float) -> Any:
    """softcap * tanh(scores / softcap) where `softcap` > 0 (the runtimes share sigmoid, not tanh)."""
    if softcap <= 0:
        return scores
    return (rt.sigmoid(scores * (2.0 / softcap)) * 2.0 - 1.0) * softcap


def _softmax(rt: Any, scores: Any, sinks: Any | None) -> Any:
    """Softmax over the last axis of scores [a, b, c, keys]; `sinks` [a or 1, b, c, 1]
    (broadcast) join it as one more column that weighs no value."""
    if sinks is None:
        return rt.softmax(scores, -1)
    shape = list(scores.shape)
    column = rt.zeros([*shape[:-1], 1], rt.dtype_name(scores)) + sinks
    return rt.softmax(rt.concat([scores, column], -1), -1)[..., : shape[-1]]


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
    sinks: Any | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> Any:
    """Causal attention of q [tokens, heads, head_dim] over caches [slots, kv_heads, head_dim]
    (over each query's last `window` positions where `window` > 0; `sinks` [heads] as
    `Backend.attention_with_sinks`; scores soft-capped as `Backend.softcapped_attention` where
    `softcap` > 0)."""
    key_cache, value_cache = kv_cache
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = key_cache.shape[1]
    group = num_heads // num_kv_heads
    out = rt.zeros(list(q.shape), rt.dtype_name(q))
    decode_mask, tile_masks = _masks(rt, meta, window)
    if sinks is not None:
        sinks = rt.cast(sinks, rt.dtype_name(q))
    if meta.decode_rows is not None:
        count, width = meta.decode_rows.shape[0], meta.decode_width
        queries = rt.index_select(q, meta.decode_rows).reshape([count, num_kv_heads, group, head_dim])
        keys = rt.index_select(key_cache, meta.decode_slots).reshape([count, width, num_kv_heads, head_dim])
        values = rt.index_select(value_cache, meta.decode_slots).reshape(
            [count, width, num_kv_heads, head_dim]
        )
        scores = (
            _capped(rt, rt.matmul(queries * scale, rt.permute(keys, [0, 2, 3, 1])), softcap) + decode_mask
        )
        head_sinks = None if sinks is None else sinks.reshape([1, num_kv_heads, group, 1])
        result = rt.matmul(_softmax(rt, scores, head_sinks), rt.permute(values, [0, 2, 1, 3]))
        rt.index_copy_(out, meta.decode_rows, result.reshape([count, num_heads, head_dim]))
    for tile, mask in zip(meta.prefill_tiles, tile_masks, strict=True):
        length = tile.end - tile.start
        keys = rt.permute(rt.index_select(key_cache, tile.slots), [1, 2, 0])  # [kvh, hd, ctx]
        values = rt.permute(rt.index_select(value_cache, tile.slots), [1, 0, 2])  # [kvh, ctx, hd]
        queries = (q[tile.start : tile.end] * scale).reshape([length, num_kv_heads, group, head_dim])
        scores = rt.matmul(rt.permute(queries, [1, 2, 0, 3]), keys.reshape([num_kv_heads, 1, head_dim, -1]))
        head_sinks = None if sinks is None else sinks.reshape([num_kv_heads, group, 1, 1])
        weights = _softmax(rt, _capped(rt, scores, softcap) + mask, head_sinks)
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
