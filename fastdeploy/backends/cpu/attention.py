"""Paged attention on the host with numpy: batched decode, per-sequence prefill.

Decode sequences (one query token each) are served together: their cache slots are gathered
into one padded [seqs, context, kv_heads, head_dim] block, masked, and reduced with batched
matmuls. Prefill chunks run one sequence at a time (a Python loop over sequences, never over
tokens), in query tiles so the score matrix stays small.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fastdeploy.backends.base import BatchLayout
from fastdeploy.backends.cpu.kv_cache import LayerKVCache, gather_numpy, store_numpy

_PREFILL_QUERY_TILE = 256
_NEG_INF = np.float32(-np.inf)


@dataclass
class PrefillSlice:
    """One sequence with more than one query token in this pass."""

    token_start: int
    token_end: int
    slots: np.ndarray  # [context] cache slots of the sequence's whole context
    context_len: int


@dataclass
class CpuAttentionMetadata:
    slot_mapping: np.ndarray
    decode_rows: np.ndarray  # [decodes] token rows of decode sequences
    decode_slots: np.ndarray  # [decodes, max_context] cache slots, padded with 0
    decode_mask: np.ndarray  # [decodes, 1, 1, max_context] 0 or -inf
    prefills: list[PrefillSlice]
    decode_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [decodes] contexts


def context_slots(block_table: np.ndarray, length: int, block_size: int) -> np.ndarray:
    """Cache slots of the first `length` tokens of a sequence with this block table."""
    positions = np.arange(length)
    return block_table[positions // block_size] * block_size + positions % block_size


def build_metadata(layout: BatchLayout) -> CpuAttentionMetadata:
    """Split a batch into the decode group and the prefill slices, computing slot indices once."""
    starts = np.concatenate([[0], np.cumsum(layout.query_lens)[:-1]]).astype(np.int64)
    is_decode = layout.query_lens == 1
    decode_seqs = np.flatnonzero(is_decode)
    if decode_seqs.size:
        lens = layout.context_lens[decode_seqs].astype(np.int64)
        width = int(lens.max())
        positions = np.arange(width)
        tables = layout.block_tables[decode_seqs]
        block_index = np.minimum(positions // layout.block_size, tables.shape[1] - 1)
        slots = tables[:, block_index] * layout.block_size + positions % layout.block_size
        valid = positions[None, :] < lens[:, None]
        slots = np.where(valid, slots, 0)
        mask = np.where(valid, np.float32(0), _NEG_INF).astype(np.float32)[:, None, None, :]
    else:
        lens = np.zeros(0, np.int64)
        slots = np.zeros((0, 0), np.int64)
        mask = np.zeros((0, 1, 1, 0), np.float32)
    prefills = [
        PrefillSlice(
            int(starts[i]),
            int(starts[i] + layout.query_lens[i]),
            context_slots(layout.block_tables[i], int(layout.context_lens[i]), layout.block_size),
            int(layout.context_lens[i]),
        )
        for i in np.flatnonzero(~is_decode)
    ]
    return CpuAttentionMetadata(layout.slot_mapping, starts[decode_seqs], slots, mask, prefills, lens)


def _softmax_inplace(scores: np.ndarray, sinks: np.ndarray | None = None) -> np.ndarray:
    """Softmax along the last axis; `sinks` (broadcast against scores[..., :1]) join each row's
    denominator and its maximum, as attention sinks do (`Backend.attention_with_sinks`)."""
    if sinks is None:
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        return scores
    top = np.maximum(scores.max(axis=-1, keepdims=True), sinks)
    scores -= top
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True) + np.exp(sinks - top)
    return scores


def _capped(scores: np.ndarray, softcap: float) -> np.ndarray:
    """Attention logit soft-capping in place, softcap * tanh(scores / softcap) (0: none)."""
    if softcap:
        cap = np.float32(softcap)
        np.tanh(scores / cap, out=scores)
        scores *= cap
    return scores


def paged_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    kv_cache: LayerKVCache,
    meta: CpuAttentionMetadata,
    scale: float,
    sinks: np.ndarray | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> np.ndarray:
    """See `Backend.attention` (`Backend.attention_with_sinks` with `sinks` [heads],
    `Backend.windowed_attention` where `window` > 0: positions before p - window + 1 are masked,
    and `Backend.softcapped_attention` where `softcap` > 0: scores capped before the mask).
    Caches are [slots, kv_heads, head_dim] arrays (kv_cache.py)."""
    store_numpy(kv_cache, meta.slot_mapping, k, v)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.keys.shape[1]
    group = num_heads // num_kv_heads
    out = np.empty_like(q)
    # [kv_heads, group, 1]: a query head's sink, beside its scores' last axis
    head_sinks = None if sinks is None else np.asarray(sinks, np.float32).reshape(num_kv_heads, group, 1)
    if meta.decode_rows.size:
        queries = q[meta.decode_rows].reshape(-1, num_kv_heads, group, head_dim) * np.float32(scale)
        keys, values = gather_numpy(kv_cache, meta.decode_slots)
        keys = keys.transpose(0, 2, 3, 1)  # [d, kvh, hd, ctx]
        scores = _capped(np.matmul(queries, keys), softcap)  # [d, kvh, group, ctx]
        scores += meta.decode_mask
        if window:
            early = np.arange(scores.shape[-1])[None, :] < (meta.decode_lens - window)[:, None]
            scores += np.where(early, _NEG_INF, np.float32(0))[:, None, None, :]
        _softmax_inplace(scores, head_sinks)
        values = values.transpose(0, 2, 1, 3)  # [d, kvh, ctx, hd]
        out[meta.decode_rows] = np.matmul(scores, values).reshape(-1, num_heads, head_dim)
    for piece in meta.prefills:
        keys, values = gather_numpy(kv_cache, piece.slots)
        keys = np.ascontiguousarray(keys.transpose(1, 2, 0))  # [kvh, hd, ctx]
        values = np.ascontiguousarray(values.transpose(1, 0, 2))  # [kvh, ctx, hd]
        first_position = piece.context_len - (piece.token_end - piece.token_start)
        for tile_start in range(piece.token_start, piece.token_end, _PREFILL_QUERY_TILE):
            tile_end = min(tile_start + _PREFILL_QUERY_TILE, piece.token_end)
            length = tile_end - tile_start
            positions = first_position + (tile_start - piece.token_start) + np.arange(length)
            visible = int(positions[-1]) + 1  # keys past the tile's last position are masked anyway
            tile = q[tile_start:tile_end] * np.float32(scale)  # [L, heads, hd]
            queries = tile.reshape(length, num_kv_heads, group, head_dim).transpose(1, 2, 0, 3)
            scores = _capped(
                np.matmul(queries, keys[:, None, :, :visible]), softcap
            )  # [kvh, group, L, visible]
            columns = np.arange(visible)[None, :]
            hidden = columns > positions[:, None]
            if window:
                hidden |= columns <= positions[:, None] - window
            scores += np.where(hidden, _NEG_INF, np.float32(0))
            _softmax_inplace(scores, None if head_sinks is None else head_sinks[:, :, :, None])
            result = np.matmul(scores, values[:, None, :visible])  # [kvh, group, L, hd]
            out[tile_start:tile_end] = result.transpose(2, 0, 1, 3).reshape(length, num_heads, head_dim)
    return out


def _native_keys(cache: LayerKVCache, blocks: np.ndarray, length: int) -> np.ndarray:
    """The first `length` keys of a sequence from a native-layout cache, float32 [kv_heads, head_dim, length]."""
    keys = cache.keys[blocks]  # [blocks, kv_heads, head_dim, block_size]
    if keys.dtype == np.uint16:  # bfloat16 bits
        keys = (keys.astype(np.uint32) << 16).view(np.float32)
    keys = keys.astype(np.float32, copy=False)
    if cache.key_scales.size:  # int8: one scale per position and kv head
        keys = keys * cache.key_scales[blocks][:, :, None, :]
    kv_heads, head_dim = keys.shape[1], keys.shape[2]
    return keys.transpose(1, 2, 0, 3).reshape(kv_heads, head_dim, -1)[:, :, :length]


def sink_factors(
    q: np.ndarray,
    cache: LayerKVCache,
    query_starts: np.ndarray,
    context_lens: np.ndarray,
    block_tables: np.ndarray,
    block_size: int,
    scale: float,
    sinks: np.ndarray,
    window: int = 0,
) -> np.ndarray:
    """[tokens, heads, 1] factors that turn attention without sinks into attention with them.

    With m_h the log-sum-exp of a query's scores, attention with a sink divides by
    exp(m_h) + exp(sink_h) instead of exp(m_h), so its output is the plain one times
    1 / (1 + exp(sink_h - m_h)). The scores come from the keys already cached (native layout);
    with `window` > 0, only each query's last `window` positions count.
    """
    tokens, heads, head_dim = q.shape
    kv_heads = cache.keys.shape[1]
    group = heads // kv_heads
    head_sinks = np.asarray(sinks, np.float64).reshape(kv_heads, group, 1)
    factors = np.empty((tokens, heads, 1), np.float32)
    for seq in range(len(context_lens)):
        start, end, length = int(query_starts[seq]), int(query_starts[seq + 1]), int(context_lens[seq])
        if end == start:
            continue
        blocks = block_tables[seq, : -(-length // block_size)]
        keys = _native_keys(cache, blocks, length).astype(np.float64)
        queries = q[start:end].astype(np.float64).reshape(end - start, kv_heads, group, head_dim) * scale
        scores = np.einsum("tkgd,kdl->tkgl", queries, keys)
        positions = length - (end - start) + np.arange(end - start)
        columns = np.arange(length)[None, :]
        hidden = columns > positions[:, None]
        if window:
            hidden |= columns <= positions[:, None] - window
        scores = np.where(hidden[:, None, None, :], -np.inf, scores)
        top = scores.max(axis=-1, keepdims=True)
        lse = top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True))
        factors[start:end] = np.exp(-np.logaddexp(0.0, head_sinks - lse)).reshape(end - start, heads, 1)
    return factors
