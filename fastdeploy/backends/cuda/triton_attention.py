"""Attention over the paged KV cache in Triton: FlashAttention-style prefill, split-KV decode.

The cache of one layer is two `[slots, kv_heads, head_dim]` tensors; position `p` of sequence
`s` lives in slot `block_tables[s, p // block_size] * block_size + p % block_size`. A tile of
`BLOCK_N` positions is gathered through the block table and fed to `tl.dot` (tensor cores), so
the paged layout costs one small table load per tile.

Prefill (`prefill_attention`): one program per (query head, query tile of one sequence), heads
varying fastest so that the query heads sharing a KV head read its tiles from L2 together; the
layout of FlashAttention 2 / Triton's fused-attention tutorial: a `BLOCK_M x head_dim` query
tile stays in registers, key/value tiles stream through, online softmax in base 2, tiles that
lie entirely before the tile's first query are processed without a mask and tiles past its last
query are never visited (causal skipping). The softmax scale is applied to each row's maximum
and inside the exponent (`s * scale - max`, one FMA per score: a positive scale commutes with
the maximum) rather than to the whole score tile first. Queries of a chunk start at position
`context_len - query_len`, so chunked prefill and prefix-cache hits are the same code.

Decode (`decode_attention`): flash-decoding. One program per (decode token, KV head, split): the
`GROUP` query heads sharing the KV head form the M side of one `tl.dot` (padded to 16 rows), the
split's share of the context streams through, and the partial (max, log-sum, accumulator) goes
to a scratch buffer that `_decode_reduce_kernel` merges. The number of splits is fixed per
launch (a CUDA graph replays it) and each program derives its range from the sequence's context
length, so short sequences leave trailing splits empty.

Sliding windows and attention sinks (`Backend.windowed_attention`, `attention_with_sinks`):
with `window` > 0 a query at position p sees p - window + 1 .. p only. Prefill visits key
tiles from the one holding its first query's first visible key, so tiles wholly before the
window are never read (a long context costs the window, and released blocks whose table
entries alias others are never loaded); a tile every query of the program sees whole still
runs unmasked. Decode spreads its splits over the window instead of the context. Sinks (a
learned logit per query head) join the softmax only at the end: the final maximum and
denominator take `exp(sink - max)`, and the split-KV reduce adds it once, after merging the
splits. Soft-capping (`softcapped_attention`, Gemma 2) caps each score at
cap * tanh(score / cap) as it leaves `tl.dot`, before the mask. All are kernel arguments (the
window and the cap scalars, the sinks a device tensor), so a captured CUDA graph replays them
with no host data per step.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from fastdeploy.backends.cuda.shared_memory import LARGE_SHARED_MEMORY

LOG2E = 1.4426950408889634
#: the same inside the kernels (sinks are natural-log logits; the softmax runs in base 2)
_LOG2E_IN_KERNEL: tl.constexpr = tl.constexpr(LOG2E)

#: key/value tile of both kernels
PREFILL_BLOCK_N = 64
DECODE_BLOCK_N = 64
#: the M side of a decode tl.dot: tensor cores need at least 16 rows
DECODE_MIN_GROUP = 16


def prefill_block_m(is_float32: bool) -> int:
    """Query rows per prefill program (also how the host metadata cuts sequences into tiles):
    128 with 16-bit storage, 64 with float32, whose tiles take twice the shared memory."""
    return 64 if is_float32 else 128


def _is_float32(tensor: Any) -> bool:
    return str(tensor.dtype).endswith("float32")


def prefill_launch_options(
    is_float32: bool, head_dim: int, shared_memory: int | None = None
) -> dict[str, int]:
    """BLOCK_N, num_warps and num_stages of the prefill kernel (the AOT check compiles with the
    same). With 16-bit storage and Hopper's shared memory, 128-key tiles in two stages measured
    fastest (8 x 2048 tokens, 32/8 heads, d 128; a sweep of 128 or 64 query rows, 128 or 64 keys,
    4 or 8 warps and 2 to 4 stages on an H200: 1.07 ms, three stages 1.24 ms, 64-key tiles 1.12
    ms; on an H100 1.05 against 1.23 ms). Ordering the tiles by the keys they read, most first,
    was slower (1.15 ms on the H200): tiles of one sequence side by side share its keys in L2."""
    if not is_float32 and (shared_memory or 0) >= LARGE_SHARED_MEMORY:
        return {"BLOCK_N": 128, "num_warps": 8, "num_stages": 2}
    return {
        # float32 tiles wider than 128 (DeepSeek's expanded 192-wide keys, padded to 256): 32 keys
        # a tile, or two stages of 64 need 213 KB of shared memory (sm_80 allows 163 KB)
        "BLOCK_N": 32 if is_float32 and head_dim > 128 else PREFILL_BLOCK_N,
        "num_warps": 4 if is_float32 and head_dim <= 64 else 8,
        "num_stages": 2 if is_float32 else 3,
    }


def decode_launch_options(is_float32: bool) -> dict[str, int]:
    return {"num_warps": 4, "num_stages": 2 if is_float32 else 3}


def _score_scale(scale: float, softcap: float) -> float:
    """The kernels' `scale_log2`: q.k to base-2 units, or 1 where soft-capping does that."""
    return 1.0 if softcap > 0 else scale * LOG2E


def _softcap_scales(scale: float, softcap: float) -> tuple[float, float]:
    """The kernels' `softcap_scale`, `softcap_log2` (unused, 1.0, without soft-capping)."""
    return (scale / softcap, softcap * LOG2E) if softcap > 0 else (1.0, 1.0)


def _dot_precision(dtype_is_fp32: bool) -> str:
    """float32 models compute float32 dot products (tf32 would change greedy tokens)."""
    return "ieee" if dtype_is_fp32 else "tf32"


@triton.jit
def _kv_tile_offsets(block_tables_ptr, table_row, n, n_mask, block_size, kv_head, num_kv_heads, head_dim):
    """Element offsets [BLOCK_N] of the first dimension of positions `n` of one KV head."""
    page = tl.load(block_tables_ptr + table_row + n // block_size, mask=n_mask, other=0).to(tl.int64)
    slots = page * block_size + n % block_size
    return (slots * num_kv_heads + kv_head) * head_dim


@triton.jit
def _capped(s, softcap_scale, softcap_log2):
    """Scores s = q.k soft-capped, in the kernels' base-2 units: cap * tanh(scale * s / cap) *
    log2(e), with `softcap_scale` = scale / cap and `softcap_log2` = cap * log2(e); tanh from
    exp2, saturating to +-1 where exp2 overflows or vanishes."""
    return (1.0 - 2.0 / (tl.exp2(s * (softcap_scale * 2.0 * _LOG2E_IN_KERNEL)) + 1.0)) * softcap_log2


@triton.jit
def _attend_tile(
    q,
    m_i,
    l_i,
    acc,
    start,
    positions,
    lo,
    hi,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    table_row,
    block_size,
    kv_head,
    num_kv_heads,
    d,
    d_mask,
    head_dim,
    scale_log2,
    window,
    softcap_scale,
    softcap_log2,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One key/value tile `start` .. + BLOCK_N into a prefill program's online softmax (rows at
    `positions`; keys outside [lo, hi) are neither loaded nor counted). Unmasked: every row sees
    the whole tile. Masked: causal, and the window where WINDOWED; a row that sees nothing yet
    keeps a zero state (its maximum stays -inf without producing NaN)."""
    n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        n_mask = (n >= lo) & (n < hi)
        kv = _kv_tile_offsets(
            block_tables_ptr, table_row, n, n_mask, block_size, kv_head, num_kv_heads, head_dim
        )
        k = tl.load(
            key_cache_ptr + kv[None, :] + d[:, None], mask=d_mask[:, None] & n_mask[None, :], other=0.0
        )
        s = tl.dot(q, k, input_precision=PRECISION)
        if SOFTCAP:  # then scale_log2 is 1: the scores are in base-2 units already
            s = _capped(s, softcap_scale, softcap_log2)
        visible = (n[None, :] <= positions[:, None]) & n_mask[None, :]
        if WINDOWED:
            visible = visible & (n[None, :] > positions[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * scale_log2)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s * scale_log2 - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        v = tl.load(
            value_cache_ptr + kv[:, None] + d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0
        )
    else:
        kv = _kv_tile_offsets(
            block_tables_ptr, table_row, n, n < hi, block_size, kv_head, num_kv_heads, head_dim
        )
        k = tl.load(key_cache_ptr + kv[None, :] + d[:, None], mask=d_mask[:, None], other=0.0)
        s = tl.dot(q, k, input_precision=PRECISION)
        if SOFTCAP:
            s = _capped(s, softcap_scale, softcap_log2)
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * scale_log2)
        p = tl.exp2(s * scale_log2 - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        v = tl.load(value_cache_ptr + kv[:, None] + d[None, :], mask=d_mask[None, :], other=0.0)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _normalise(m_i, l_i, acc, sinks_ptr, heads, heads_mask, HAS_SINKS: tl.constexpr):
    """acc / the softmax denominator, which with sinks also holds exp(sink - max) of each row's
    head (its maximum taken with the sink); rows that saw nothing give zeros."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + heads, mask=heads_mask, other=float("-inf")).to(tl.float32)
        sink = sink * _LOG2E_IN_KERNEL
        top = tl.maximum(m_i, sink)
        top = tl.where(top == float("-inf"), 0.0, top)
        alpha = tl.exp2(m_i - top)
        l_i = l_i * alpha + tl.exp2(sink - top)
        acc = acc * alpha[:, None]
    return acc / tl.maximum(l_i, 1e-30)[:, None]


@triton.jit
def _prefill_kernel(
    q_ptr,
    key_cache_ptr,
    value_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_query_start_ptr,
    seq_query_len_ptr,
    seq_context_len_ptr,
    tile_seq_ptr,
    tile_offset_ptr,
    sinks_ptr,
    scale_log2,
    window,
    softcap_scale,
    softcap_log2,
    num_heads,
    num_kv_heads,
    head_dim,
    block_size,
    max_blocks,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    head = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = head // GROUP
    seq = tl.load(tile_seq_ptr + tile).to(tl.int64)
    offset = tl.load(tile_offset_ptr + tile)  # first query of the tile, within the sequence
    query_start = tl.load(seq_query_start_ptr + seq)
    query_len = tl.load(seq_query_len_ptr + seq)
    context = tl.load(seq_context_len_ptr + seq)
    table_row = seq * max_blocks

    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    d_mask = d < head_dim
    row_mask = offset + m < query_len
    rows = (query_start + offset + m).to(tl.int64)
    q_offsets = (rows * num_heads + head)[:, None] * head_dim + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    positions = context - query_len + offset + m  # absolute position of each query

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first_position = context - query_len + offset
    # keys every query of the tile sees: whole tiles before the first query need no mask
    unmasked_end = ((first_position + 1) // BLOCK_N) * BLOCK_N
    last_key = tl.minimum(first_position + BLOCK_M, context)  # causal: nothing past the last query
    lo = 0
    unmasked_start = 0
    if WINDOWED:
        # the first query's first key: earlier tiles are skipped; unmasked only from the last
        # query's first key on
        lo = tl.maximum(first_position - window + 1, 0)
        last_position = tl.minimum(first_position + BLOCK_M, context) - 1
        seen_by_all = tl.maximum(last_position - window + 1, 0)
        unmasked_start = tl.minimum(tl.cdiv(seen_by_all, BLOCK_N) * BLOCK_N, unmasked_end)
    for start in range((lo // BLOCK_N) * BLOCK_N, unmasked_start, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, start, positions, lo, context, key_cache_ptr, value_cache_ptr,
            block_tables_ptr, table_row, block_size, kv_head, num_kv_heads, d, d_mask, head_dim,
            scale_log2, window, softcap_scale, softcap_log2, BLOCK_N, True, WINDOWED, SOFTCAP, PRECISION,
        )  # fmt: skip
    for start in range(unmasked_start, unmasked_end, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, start, positions, lo, context, key_cache_ptr, value_cache_ptr,
            block_tables_ptr, table_row, block_size, kv_head, num_kv_heads, d, d_mask, head_dim,
            scale_log2, window, softcap_scale, softcap_log2, BLOCK_N, False, WINDOWED, SOFTCAP, PRECISION,
        )  # fmt: skip
    for start in range(unmasked_end, last_key, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, start, positions, lo, context, key_cache_ptr, value_cache_ptr,
            block_tables_ptr, table_row, block_size, kv_head, num_kv_heads, d, d_mask, head_dim,
            scale_log2, window, softcap_scale, softcap_log2, BLOCK_N, True, WINDOWED, SOFTCAP, PRECISION,
        )  # fmt: skip
    out = _normalise(m_i, l_i, acc, sinks_ptr, head + m * 0, row_mask, HAS_SINKS)
    tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def prefill_attention(
    q: Any,
    key_cache: Any,
    value_cache: Any,
    out: Any,
    block_tables: Any,
    seq_query_start: Any,
    seq_query_len: Any,
    seq_context_len: Any,
    tile_seq: Any,
    tile_offset: Any,
    scale: float,
    block_size: int,
    shared_memory: int | None = None,
    sinks: Any = None,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """Causal attention of the prefill tokens of q [tokens, heads, head_dim] into out.

    Sequence s owns token rows [seq_query_start[s], + seq_query_len[s]) whose positions end at
    seq_context_len[s] - 1; its keys/values (this step's included) are already in the caches
    [slots, kv_heads, head_dim]. The tiles (from `prefill_tiles`) list (sequence, first query)
    pairs of `prefill_block_m` queries; rows of other sequences are not touched. `shared_memory`
    (bytes one program may use on this GPU) picks the tile sizes. `sinks` [heads] (any float
    dtype) join each row's softmax denominator; `window` > 0 limits each query to its last
    `window` positions; `softcap` > 0 caps each scaled score at softcap * tanh(score / softcap).
    """
    fp32 = _is_float32(q)
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = key_cache.shape[1]
    num_tiles = tile_seq.shape[0]
    if num_tiles == 0:
        return
    _prefill_kernel[(heads, num_tiles)](
        q,
        key_cache,
        value_cache,
        out,
        block_tables,
        seq_query_start,
        seq_query_len,
        seq_context_len,
        tile_seq,
        tile_offset,
        sinks if sinks is not None else q,
        _score_scale(scale, softcap),
        window,
        *_softcap_scales(scale, softcap),
        heads,
        kv_heads,
        head_dim,
        block_size,
        block_tables.shape[1],
        GROUP=heads // kv_heads,
        HEAD_DIM=max(triton.next_power_of_2(head_dim), 16),
        BLOCK_M=prefill_block_m(fp32),
        PRECISION=_dot_precision(fp32),
        WINDOWED=window > 0,
        HAS_SINKS=sinks is not None,
        SOFTCAP=softcap > 0,
        **prefill_launch_options(fp32, head_dim, shared_memory),
    )


@triton.jit
def _decode_kernel(
    q_ptr,
    key_cache_ptr,
    value_cache_ptr,
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    block_tables_ptr,
    decode_token_ptr,
    decode_seq_ptr,
    seq_context_len_ptr,
    sinks_ptr,
    scale_log2,
    window,
    softcap_scale,
    softcap_log2,
    num_heads,
    num_kv_heads,
    head_dim,
    block_size,
    max_blocks,
    GROUP: tl.constexpr,
    GROUP_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    index = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    token = tl.load(decode_token_ptr + index).to(tl.int64)
    seq = tl.load(decode_seq_ptr + index).to(tl.int64)
    context = tl.load(seq_context_len_ptr + seq)
    table_row = seq * max_blocks

    g = tl.arange(0, GROUP_BLOCK)
    d = tl.arange(0, HEAD_DIM)
    g_mask = g < GROUP
    d_mask = d < head_dim
    heads = kv_head * GROUP + g
    q_offsets = (token * num_heads + heads)[:, None] * head_dim + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    # the positions the token sees (the last `window` with a window), shared out among the
    # splits in whole tiles except at the end
    first = 0
    if WINDOWED:
        first = tl.maximum(context - window, 0)
    per_split = tl.cdiv(tl.cdiv(context - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * per_split
    end = tl.minimum(start + per_split, context)
    m_i = tl.full([GROUP_BLOCK], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_BLOCK], tl.float32)
    acc = tl.zeros([GROUP_BLOCK, HEAD_DIM], tl.float32)
    for tile_start in range(start, end, BLOCK_N):
        n = tile_start + tl.arange(0, BLOCK_N)
        n_mask = n < end
        kv = _kv_tile_offsets(
            block_tables_ptr, table_row, n, n_mask, block_size, kv_head, num_kv_heads, head_dim
        )
        k = tl.load(
            key_cache_ptr + kv[None, :] + d[:, None], mask=d_mask[:, None] & n_mask[None, :], other=0.0
        )
        s = tl.dot(q, k, input_precision=PRECISION)
        if SOFTCAP:  # scale_log2 is 1 then
            s = _capped(s, softcap_scale, softcap_log2)
        s = tl.where(n_mask[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            value_cache_ptr + kv[:, None] + d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out_mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        # empty contexts (padded rows) give zeros
        out = _normalise(m_i, l_i, acc, sinks_ptr, heads, g_mask, HAS_SINKS)
        tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # partial results: [decodes, heads, splits, head_dim] and log2-sum-exp [decodes, heads, splits]
        row = (index * num_heads + heads) * NUM_SPLITS + split
        tl.store(
            partial_out_ptr + row[:, None] * head_dim + d[None, :],
            acc / tl.maximum(l_i, 1e-30)[:, None],
            mask=out_mask,
        )
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(partial_lse_ptr + row, lse, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    decode_token_ptr,
    sinks_ptr,
    num_heads,
    head_dim,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    index = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(decode_token_ptr + index).to(tl.int64)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HEAD_DIM)
    d_mask = d < head_dim
    row = (index * num_heads + head) * NUM_SPLITS
    lse = tl.load(partial_lse_ptr + row + s)
    top = tl.max(lse, axis=0)
    if HAS_SINKS:  # the sink joins the merged denominator once (and its maximum)
        sink = tl.load(sinks_ptr + head).to(tl.float32) * _LOG2E_IN_KERNEL
        top = tl.maximum(top, sink)
    top = tl.where(top == float("-inf"), 0.0, top)
    weights = tl.exp2(lse - top)
    parts = tl.load(
        partial_out_ptr + (row + s)[:, None] * head_dim + d[None, :], mask=d_mask[None, :], other=0.0
    )
    total = tl.sum(weights, axis=0)
    if HAS_SINKS:
        total += tl.exp2(sink - top)
    out = tl.sum(parts * weights[:, None], axis=0) / tl.maximum(total, 1e-30)
    tl.store(
        out_ptr + (token * num_heads + head) * head_dim + d, out.to(out_ptr.dtype.element_ty), mask=d_mask
    )


def decode_splits(num_decodes: int, num_kv_heads: int, max_context: int, num_sms: int = 132) -> int:
    """Splits per sequence so that about two waves of programs fill the GPU, each split at least
    256 positions; a power of two (the reduce kernel loads all splits at once)."""
    programs = max(num_decodes * num_kv_heads, 1)
    wanted = max(1, (2 * num_sms) // programs)
    longest = max(1, max_context // 256)
    return triton.next_power_of_2(min(wanted, longest, 64)) if min(wanted, longest) > 1 else 1


def decode_attention(
    q: Any,
    key_cache: Any,
    value_cache: Any,
    out: Any,
    block_tables: Any,
    decode_token: Any,
    decode_seq: Any,
    seq_context_len: Any,
    partial_out: Any,
    partial_lse: Any,
    scale: float,
    block_size: int,
    num_splits: int,
    sinks: Any = None,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """Attention of single decode tokens over their whole context (or its last `window`
    positions), split-KV.

    decode_token[i] is the row of q/out [tokens, heads, head_dim] of decode i and decode_seq[i]
    its sequence (row of block_tables / seq_context_len). With num_splits > 1 the scratch
    partial_out [decodes, heads, num_splits, head_dim] float32 and partial_lse
    [decodes, heads, num_splits] float32 hold the split results before the reduce kernel.
    `sinks` [heads] and `softcap` as in `prefill_attention`.
    """
    decodes = decode_token.shape[0]
    if decodes == 0:
        return
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = key_cache.shape[1]
    group = heads // kv_heads
    head_block = max(triton.next_power_of_2(head_dim), 16)
    _decode_kernel[(decodes, kv_heads, num_splits)](
        q,
        key_cache,
        value_cache,
        out,
        partial_out,
        partial_lse,
        block_tables,
        decode_token,
        decode_seq,
        seq_context_len,
        sinks if sinks is not None else q,
        _score_scale(scale, softcap),
        window,
        *_softcap_scales(scale, softcap),
        heads,
        kv_heads,
        head_dim,
        block_size,
        block_tables.shape[1],
        GROUP=group,
        GROUP_BLOCK=max(triton.next_power_of_2(group), DECODE_MIN_GROUP),
        HEAD_DIM=head_block,
        BLOCK_N=DECODE_BLOCK_N,
        NUM_SPLITS=num_splits,
        PRECISION=_dot_precision(_is_float32(q)),
        WINDOWED=window > 0,
        HAS_SINKS=sinks is not None,
        SOFTCAP=softcap > 0,
        **decode_launch_options(_is_float32(q)),
    )
    if num_splits > 1:
        _decode_reduce_kernel[(decodes, heads)](
            out,
            partial_out,
            partial_lse,
            decode_token,
            sinks if sinks is not None else out,
            heads,
            head_dim,
            HEAD_DIM=head_block,
            NUM_SPLITS=num_splits,
            HAS_SINKS=sinks is not None,
        )
