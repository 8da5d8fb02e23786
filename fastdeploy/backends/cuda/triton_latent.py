"""Multi-head latent attention's Triton kernels: the latent cache's store and the absorbed decode.

A layer's "latent" cache is one `[slots, lora + rope]` tensor: each token's compressed latent c
followed by its rotary key k_r, paged like the other caches (slot `block_tables[s, p //
block_size] * block_size + p % block_size` for position p of sequence s).

Decode (`latent_decode`; also the few queries of a speculative verify pass, each seeing one
more position than the last) is multi-query attention over that cache with the absorbed queries:
every head's query is (q_c, q_r) = (q_nope @ absorb_k[h], q_rope) and every head reads the same
latent rows, as key (c, k_r) and as value c. One program per (query, block of `HEAD_BLOCK`
heads, split): a `BLOCK_N x lora` latent tile is loaded once and serves both `tl.dot`s (scores
q_c . c + q_r . k_r, and the probabilities' mix of c), so no per-head key or value is formed and
the latent tile is the only context read. Split-KV as the paged decode kernel
(`triton_attention`): the split count is fixed per launch (a captured CUDA graph replays it),
each program derives its range from the context length (0: a padded row, zeros), and
`_latent_reduce_kernel` merges the splits' (log-sum, partial mix). The result is the mixed
latent per head [decodes, heads, lora]; the caller takes it through absorb_v.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from fastdeploy.backends.cuda.triton_attention import LOG2E, _dot_precision, _is_float32

#: heads per decode program: the M side of both `tl.dot`s (tensor cores need 16 rows)
LATENT_HEAD_BLOCK = 16


def latent_block_n(lora: int) -> int:
    """Context positions per tile: 32 for DeepSeek-V3's 512-wide latents (a 32 x 512 16-bit tile
    is 32 KiB of shared memory per stage), 64 for narrower ones."""
    return 32 if lora >= 256 else 64


def latent_launch_options(lora: int) -> dict[str, int]:
    """num_warps / num_stages of the decode kernel (the AOT check compiles with the same)."""
    return {"num_warps": 4 if lora <= 256 else 8, "num_stages": 2}


@triton.jit
def _store_latent_kernel(
    latent_ptr,
    k_rope_ptr,
    cache_ptr,
    slot_mapping_ptr,
    lora,
    rope,
    LORA_BLOCK: tl.constexpr,
    ROPE_BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding rows of a CUDA-graph batch write nothing
        return
    c = tl.arange(0, LORA_BLOCK)
    r = tl.arange(0, ROPE_BLOCK)
    row = cache_ptr + slot * (lora + rope)
    tl.store(row + c, tl.load(latent_ptr + token * lora + c, mask=c < lora), mask=c < lora)
    tl.store(row + lora + r, tl.load(k_rope_ptr + token * rope + r, mask=r < rope), mask=r < rope)


def store_latent(latent: Any, k_rope: Any, cache: Any, slot_mapping: Any) -> None:
    """latent [tokens, lora] and k_rope [tokens, rope] (contiguous, the cache's dtype) into the
    cache [slots, lora + rope] at slot_mapping (int64; a negative slot skips its token)."""
    tokens, lora = latent.shape
    rope = k_rope.shape[1]
    if tokens == 0:
        return
    _store_latent_kernel[(tokens,)](
        latent,
        k_rope,
        cache,
        slot_mapping,
        lora,
        rope,
        LORA_BLOCK=triton.next_power_of_2(lora),
        ROPE_BLOCK=triton.next_power_of_2(rope),
    )


@triton.jit
def _latent_decode_kernel(
    q_latent_ptr,
    q_rope_ptr,
    cache_ptr,
    mixed_ptr,
    partial_ptr,
    partial_lse_ptr,
    block_tables_ptr,
    decode_seq_ptr,
    context_ptr,
    scale_log2,
    num_heads,
    lora,
    rope,
    block_size,
    max_blocks,
    HEAD_BLOCK: tl.constexpr,
    LORA_BLOCK: tl.constexpr,
    ROPE_BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    index = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEAD_BLOCK + tl.arange(0, HEAD_BLOCK)
    split = tl.program_id(2)
    seq = tl.load(decode_seq_ptr + index).to(tl.int64)
    context = tl.load(context_ptr + index)  # the positions this query sees: causal within its sequence
    table_row = seq * max_blocks
    width = lora + rope

    h_mask = heads < num_heads
    c = tl.arange(0, LORA_BLOCK)
    r = tl.arange(0, ROPE_BLOCK)
    c_mask = c < lora
    r_mask = r < rope
    rows = index * num_heads + heads
    q_c = tl.load(
        q_latent_ptr + rows[:, None] * lora + c[None, :], mask=h_mask[:, None] & c_mask[None, :], other=0.0
    )
    q_r = tl.load(
        q_rope_ptr + rows[:, None] * rope + r[None, :], mask=h_mask[:, None] & r_mask[None, :], other=0.0
    )

    per_split = tl.cdiv(tl.cdiv(context, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, context)
    m_i = tl.full([HEAD_BLOCK], float("-inf"), tl.float32)
    l_i = tl.zeros([HEAD_BLOCK], tl.float32)
    acc = tl.zeros([HEAD_BLOCK, LORA_BLOCK], tl.float32)
    for tile_start in range(start, end, BLOCK_N):
        n = tile_start + tl.arange(0, BLOCK_N)
        n_mask = n < end
        page = tl.load(block_tables_ptr + table_row + n // block_size, mask=n_mask, other=0).to(tl.int64)
        base = (page * block_size + n % block_size) * width
        c_tile = tl.load(
            cache_ptr + base[:, None] + c[None, :], mask=n_mask[:, None] & c_mask[None, :], other=0.0
        )
        r_tile = tl.load(
            cache_ptr + base[:, None] + lora + r[None, :], mask=n_mask[:, None] & r_mask[None, :], other=0.0
        )
        s = tl.dot(q_c, tl.trans(c_tile), input_precision=PRECISION)
        s += tl.dot(q_r, tl.trans(r_tile), input_precision=PRECISION)
        s = tl.where(n_mask[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c_tile.dtype), c_tile, input_precision=PRECISION)
        m_i = m_new
    out_mask = h_mask[:, None] & c_mask[None, :]
    if NUM_SPLITS == 1:  # an empty context (a padded row) gives zeros
        out = acc / tl.maximum(l_i, 1e-30)[:, None]
        tl.store(
            mixed_ptr + rows[:, None] * lora + c[None, :], out.to(mixed_ptr.dtype.element_ty), mask=out_mask
        )
    else:  # partial mixes [decodes, heads, splits, lora] and log2-sum-exp [decodes, heads, splits]
        partial = rows * NUM_SPLITS + split
        tl.store(
            partial_ptr + partial[:, None] * lora + c[None, :],
            acc / tl.maximum(l_i, 1e-30)[:, None],
            mask=out_mask,
        )
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(partial_lse_ptr + partial, lse, mask=h_mask)


@triton.jit
def _latent_reduce_kernel(
    mixed_ptr, partial_ptr, partial_lse_ptr, lora, LORA_BLOCK: tl.constexpr, NUM_SPLITS: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)  # decode * heads + head
    s = tl.arange(0, NUM_SPLITS)
    c = tl.arange(0, LORA_BLOCK)
    c_mask = c < lora
    lse = tl.load(partial_lse_ptr + row * NUM_SPLITS + s)
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    weights = tl.exp2(lse - top)
    parts = tl.load(
        partial_ptr + (row * NUM_SPLITS + s)[:, None] * lora + c[None, :], mask=c_mask[None, :], other=0.0
    )
    out = tl.sum(parts * weights[:, None], axis=0) / tl.maximum(tl.sum(weights, axis=0), 1e-30)
    tl.store(mixed_ptr + row * lora + c, out.to(mixed_ptr.dtype.element_ty), mask=c_mask)


def latent_decode(
    q_latent: Any,
    q_rope: Any,
    cache: Any,
    mixed: Any,
    block_tables: Any,
    decode_seq: Any,
    context: Any,
    partial: Any,
    partial_lse: Any,
    scale: float,
    block_size: int,
    num_splits: int,
) -> None:
    """Absorbed latent attention of single queries over the first context[i] positions of their
    sequence, split-KV.

    Query i is q_latent[i] [heads, lora] (q_nope through absorb_k) and q_rope[i] [heads, rope]
    (both contiguous [queries, heads, *]); its sequence is decode_seq[i] (row of block_tables)
    and it sees that sequence's positions 0 .. context[i] - 1 (a decode: the whole context; the
    queries of a speculative verify pass: one more each). Writes the probabilities' mix of the
    cached latents, mixed [queries, heads, lora]. With num_splits > 1, partial [decodes, heads, num_splits,
    lora] and partial_lse [decodes, heads, num_splits] (float32) hold the splits before the
    reduce kernel merges them.
    """
    decodes, heads, lora = q_latent.shape
    if decodes == 0:
        return
    rope = q_rope.shape[2]
    lora_block = max(triton.next_power_of_2(lora), 16)
    fp32 = _is_float32(q_latent)
    _latent_decode_kernel[(decodes, triton.cdiv(heads, LATENT_HEAD_BLOCK), num_splits)](
        q_latent,
        q_rope,
        cache,
        mixed,
        partial,
        partial_lse,
        block_tables,
        decode_seq,
        context,
        scale * LOG2E,
        heads,
        lora,
        rope,
        block_size,
        block_tables.shape[1],
        HEAD_BLOCK=LATENT_HEAD_BLOCK,
        LORA_BLOCK=lora_block,
        ROPE_BLOCK=max(triton.next_power_of_2(rope), 16),
        BLOCK_N=latent_block_n(lora),
        NUM_SPLITS=num_splits,
        PRECISION=_dot_precision(fp32),
        **latent_launch_options(lora_block),
    )
    if num_splits > 1:
        _latent_reduce_kernel[(decodes * heads,)](
            mixed, partial, partial_lse, lora, LORA_BLOCK=lora_block, NUM_SPLITS=num_splits
        )
