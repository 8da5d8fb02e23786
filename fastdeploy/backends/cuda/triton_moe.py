"""Mixture-of-experts in Triton: routing, tokens sorted by expert, grouped GEMMs with tl.dot.

The layout follows what vLLM's fused_moe does (facts, not code): every (token, k) pair is an
"entry"; entries are sorted by expert and each expert's run is padded to a multiple of BLOCK_M,
so every BLOCK_M-row tile of the sorted list belongs to one expert. One GEMM program computes a
BLOCK_M x BLOCK_N tile of one expert's product, gathering its A rows through the sorted entry
ids, reading that expert's weight tile, and scattering the result back to the entries' rows.

- `moe_route`: softmax over experts, top-k on probabilities + correction bias (chosen by the
  biased score, weighted by the unbiased probability), renormalised.
- `moe_align`: counts per expert, padded offsets, the expert of every tile, and the sorted
  entry ids (padding entries hold `tokens * top_k`, which every GEMM skips). Entries routed to
  an expert outside [0, experts) (another rank's, under expert parallelism) are left out.
- `moe_gemm`: C[entry] = A[row] @ W[expert] (x rows for the gate/up GEMM, intermediate rows for
  the down GEMM), optionally scaled by the entry's routing weight. Expert weights may be wint8,
  wint4 or block-FP8 (docs/quantization.md), dequantised in registers.

Weights are stored [experts, in, out] so a weight tile is contiguous along `out`.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from fastdeploy.backends.cuda.shared_memory import LARGE_SHARED_MEMORY


@triton.jit
def _route_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    tokens,
    num_experts,
    norm_min,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    TOP_K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    EXPERTS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.arange(0, EXPERTS)
    t_mask = t < tokens
    e_mask = e < num_experts
    logits = tl.load(
        logits_ptr + t[:, None].to(tl.int64) * num_experts + e[None, :],
        mask=t_mask[:, None] & e_mask[None, :],
        other=0.0,  # rows past the last token stay finite (they are not stored)
    ).to(tl.float32)
    logits = tl.where(e_mask[None, :], logits, float("-inf"))
    top = tl.max(logits, axis=1)
    probs = tl.exp(logits - top[:, None])
    probs = probs / tl.sum(probs, axis=1)[:, None]
    scores = probs
    if HAS_BIAS:
        scores = probs + tl.load(bias_ptr + e, mask=e_mask, other=0.0).to(tl.float32)[None, :]
    scores = tl.where(e_mask[None, :], scores, float("-inf"))
    k = tl.arange(0, K_BLOCK)
    chosen_ids = tl.zeros([BLOCK_T, K_BLOCK], tl.int32)
    chosen_weights = tl.zeros([BLOCK_T, K_BLOCK], tl.float32)
    for i in tl.static_range(TOP_K):
        best = tl.argmax(scores, axis=1)  # the first index among equal scores
        picked = e[None, :] == best[:, None]
        weight = tl.sum(tl.where(picked, probs, 0.0), axis=1)
        chosen_ids = tl.where(k[None, :] == i, best[:, None], chosen_ids)
        chosen_weights = tl.where(k[None, :] == i, weight[:, None], chosen_weights)
        scores = tl.where(picked, float("-inf"), scores)
    if RENORMALIZE:
        chosen_weights = chosen_weights / tl.maximum(tl.sum(chosen_weights, axis=1), norm_min)[:, None]
    out = t[:, None].to(tl.int64) * TOP_K + k[None, :]
    out_mask = t_mask[:, None] & (k[None, :] < TOP_K)
    tl.store(weights_ptr + out, chosen_weights, mask=out_mask)
    tl.store(ids_ptr + out, chosen_ids, mask=out_mask)


def moe_route(
    router_logits: Any,
    correction_bias: Any,
    weights: Any,
    ids: Any,
    top_k: int,
    renormalize: bool,
    norm_min: float,
) -> None:
    """weights [tokens, top_k] float32 and ids [tokens, top_k] int32 from router_logits [tokens, experts]."""
    tokens, experts = router_logits.shape
    block_t = 16
    _route_kernel[(triton.cdiv(tokens, block_t),)](
        router_logits,
        correction_bias if correction_bias is not None else router_logits,
        weights,
        ids,
        tokens,
        experts,
        norm_min,
        HAS_BIAS=correction_bias is not None,
        RENORMALIZE=renormalize,
        TOP_K=top_k,
        K_BLOCK=triton.next_power_of_2(top_k),
        EXPERTS=max(triton.next_power_of_2(experts), 2),
        BLOCK_T=block_t,
    )


@triton.jit
def _align_kernel(
    ids_ptr,
    sorted_ptr,
    block_expert_ptr,
    cursor_ptr,
    total_ptr,
    entries,
    num_experts,
    max_sorted,
    max_blocks,
    EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
):
    """One program: counts per expert, padded offsets, tile experts; fills sorted with padding."""
    e = tl.arange(0, EXPERTS)
    counts = tl.zeros([EXPERTS], tl.int32)
    for start in range(0, entries, TILE):
        i = start + tl.arange(0, TILE)
        expert = tl.load(ids_ptr + i, mask=i < entries, other=EXPERTS).to(tl.int32)
        expert = tl.where((expert >= 0) & (expert < num_experts), expert, EXPERTS)  # others': none
        counts += tl.sum((expert[:, None] == e[None, :]).to(tl.int32), axis=0)
    padded = tl.cdiv(counts, BLOCK_M) * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    tl.store(cursor_ptr + e, starts, mask=e < num_experts)
    total = tl.sum(padded, axis=0)
    tl.store(total_ptr, total)
    for start in range(0, max_blocks, TILE):
        b = start + tl.arange(0, TILE)
        owner = tl.sum((ends[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, owner, mask=b < max_blocks)
    for start in range(0, max_sorted, TILE):
        i = start + tl.arange(0, TILE)
        tl.store(sorted_ptr + i, tl.full([TILE], 0, tl.int32) + entries, mask=i < max_sorted)


@triton.jit
def _scatter_kernel(ids_ptr, sorted_ptr, cursor_ptr, entries, num_experts, TILE: tl.constexpr):
    i = tl.program_id(0) * TILE + tl.arange(0, TILE)
    expert = tl.load(ids_ptr + i, mask=i < entries, other=0).to(tl.int32)
    mask = (i < entries) & (expert >= 0) & (expert < num_experts)
    slot = tl.atomic_add(cursor_ptr + expert, 1, mask=mask)
    tl.store(sorted_ptr + slot, i.to(tl.int32), mask=mask)


def max_sorted_entries(entries: int, num_experts: int, block_m: int) -> int:
    """Length of the padded, expert-sorted entry list in the worst case."""
    return entries + num_experts * (block_m - 1)


def moe_align(
    ids: Any, num_experts: int, block_m: int, sorted_ids: Any, block_expert: Any, cursor: Any, total: Any
) -> None:
    """Sort the entries of ids [tokens, top_k] by expert into sorted_ids [max_sorted_entries]
    (entries whose id is outside [0, num_experts) are dropped).

    block_expert [max_sorted / block_m] int32 gets each tile's expert, total [1] int32 the padded
    length; cursor [experts] int32 is scratch. Order within an expert is unspecified (it does
    not change any result: every entry's row is computed alone).
    """
    entries = ids.numel() if hasattr(ids, "numel") and callable(ids.numel) else ids.shape[0] * ids.shape[1]
    max_sorted = sorted_ids.shape[0]
    tile = 1024
    _align_kernel[(1,)](
        ids,
        sorted_ids,
        block_expert,
        cursor,
        total,
        entries,
        num_experts,
        max_sorted,
        block_expert.shape[0],
        EXPERTS=max(triton.next_power_of_2(num_experts), 2),
        BLOCK_M=block_m,
        TILE=tile,
    )
    _scatter_kernel[(triton.cdiv(entries, tile),)](ids, sorted_ids, cursor, entries, num_experts, TILE=tile)


@triton.jit
def _gemm_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    sorted_ptr,
    block_expert_ptr,
    total_ptr,
    routing_ptr,
    scale_ptr,
    entries,
    n_size,
    k_size,
    TOP_K: tl.constexpr,
    A_PER_ENTRY: tl.constexpr,
    MUL_ROUTING: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    W_FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
):
    pid_n = tl.program_id(0)  # the N tiles of one row tile run together: its rows stay in L2
    pid_m = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    entry = tl.load(sorted_ptr + m)
    m_mask = entry < entries
    a_row = entry if A_PER_ENTRY else entry // TOP_K
    a_row = tl.where(m_mask, a_row, 0).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < n_size
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if W_FORMAT == 2:  # wint4 experts: [experts, k / 2, n] bytes, scales [experts, k / GROUP, n]
        half = tl.arange(0, BLOCK_K // 2)
        a_rows = a_ptr + a_row[:, None] * k_size
        w_base = w_ptr + expert * (k_size // 2) * n_size
        s_base = scale_ptr + expert * (k_size // GROUP) * n_size
        for k0 in range(0, k_size, BLOCK_K):
            j = k0 // 2 + half
            j_mask = 2 * j < k_size
            pair = tl.load(
                w_base + j[:, None] * n_size + n[None, :], mask=j_mask[:, None] & n_mask[None, :], other=0x88
            ).to(tl.int32)
            scale = tl.load(s_base + (k0 // GROUP) * n_size + n, mask=n_mask, other=0.0).to(tl.float32)
            low = (((pair & 15) - 8).to(tl.float32) * scale[None, :]).to(a_ptr.dtype.element_ty)
            high = (((pair >> 4) - 8).to(tl.float32) * scale[None, :]).to(a_ptr.dtype.element_ty)
            a_mask = m_mask[:, None] & j_mask[None, :]
            even = tl.load(a_rows + 2 * j[None, :], mask=a_mask, other=0.0)
            odd = tl.load(a_rows + 2 * j[None, :] + 1, mask=a_mask, other=0.0)
            acc = tl.dot(even, low, acc, input_precision=PRECISION)
            acc = tl.dot(odd, high, acc, input_precision=PRECISION)
    else:  # float experts, or wint8 / fp8 ones in the same [experts, k, n] layout
        kk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_row[:, None] * k_size + kk[None, :]
        w_ptrs = w_ptr + expert * k_size * n_size + kk[:, None] * n_size + n[None, :]
        # fp8 scales [experts, k / 128, n / 128]: a K tile lies within one 128-deep block
        fp8_scales = scale_ptr + expert * tl.cdiv(k_size, 128) * tl.cdiv(n_size, 128) + n // 128
        for k0 in range(0, k_size, BLOCK_K):
            k_mask = kk + k0 < k_size
            a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            if W_FORMAT == 3:  # e4m3 bits, one scale per 128 x 128 block
                scale = tl.load(fp8_scales + (k0 // 128) * tl.cdiv(n_size, 128), mask=n_mask, other=0.0)
                w = w.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[None, :]
            acc = tl.dot(a, w.to(a_ptr.dtype.element_ty), acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K * n_size
        if W_FORMAT == 1:
            acc = (
                acc * tl.load(scale_ptr + expert * n_size + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            )
    if MUL_ROUTING:
        acc = acc * tl.load(routing_ptr + entry, mask=m_mask, other=0.0)[:, None]
    c_ptrs = c_ptr + tl.where(m_mask, entry, 0).to(tl.int64)[:, None] * n_size + n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def gemm_config(
    entries: int, num_experts: int, is_float32: bool = False, shared_memory: int | None = None
) -> dict[str, int]:
    """Tile shapes by the average number of entries per expert (small: decode steps); float32
    tiles take twice the shared memory, so they pipeline one stage less. Large batches with
    Hopper's shared memory (`shared_memory` bytes per program) take 256-wide tiles in four
    stages: 1.77 ms against 2.10 ms on an H100 for 4096 tokens of ERNIE-4.5-21B-A3B's experts
    (1.58 ms since `_gemm_kernel` runs a row tile's N tiles together)."""
    per_expert = entries / max(num_experts, 1)
    stages = 2 if is_float32 else 3
    if per_expert <= 16:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": stages}
    if per_expert <= 96:
        return {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": stages}
    if not is_float32 and (shared_memory or 0) >= LARGE_SHARED_MEMORY:
        return {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": stages}


def moe_gemm(
    a: Any,
    weights: Any,
    out: Any,
    sorted_ids: Any,
    block_expert: Any,
    total: Any,
    routing: Any | None,
    top_k: int,
    a_per_entry: bool,
    config: dict[str, int],
    scales: Any | None = None,
    group_size: int = 0,
    fp8: bool = False,
) -> None:
    """out[entry] = a[row] @ weights[expert(entry)] (* routing[entry]) for every sorted entry.

    a: [tokens, k] (row = entry // top_k) or [entries, k] with `a_per_entry`; weights
    [experts, k, n] in a's dtype, or quantised: wint8 (int8 [experts, k, n], `scales` [experts,
    n]), wint4 (`group_size` given: uint8 [experts, k / 2, n] holding inputs 2i / 2i + 1 in the
    low / high nibble, biased by 8, `scales` [experts, k / group_size, n]; config["BLOCK_K"] must
    divide group_size) or, with `fp8`, e4m3 bits (uint8 [experts, k, n], `scales` [experts,
    ceil(k / 128), ceil(n / 128)], one per 128 x 128 block; config["BLOCK_K"] must divide 128);
    out [entries, n]. The tiles come from `moe_align` with config["BLOCK_M"].
    """
    w_format = 3 if fp8 else 0 if scales is None else (2 if group_size else 1)
    k_size = weights.shape[1] * (2 if w_format == 2 else 1)
    n_size = weights.shape[2]
    entries = out.shape[0]
    grid = (triton.cdiv(n_size, config["BLOCK_N"]), block_expert.shape[0])
    _gemm_kernel[grid](
        a,
        weights,
        out,
        sorted_ids,
        block_expert,
        total,
        routing if routing is not None else out,
        scales if scales is not None else out,
        entries,
        n_size,
        k_size,
        TOP_K=top_k,
        A_PER_ENTRY=a_per_entry,
        MUL_ROUTING=routing is not None,
        PRECISION="ieee" if str(a.dtype).endswith("float32") else "tf32",
        W_FORMAT=w_format,
        GROUP=max(group_size, 1),
        **config,
    )
