"""The segmented LoRA products (Punica's SGMV) as one Triton kernel run twice.

A pass's rows with an adapter are sorted by slot (`backends/lora.py: segments`); program
(segment, row tile, column tile) multiplies its rows by its segment's slot of a stacked weight
[slots, k, n]. Shrink gathers the pass's rows of x into u [rows with an adapter, rank] (sorted
order); expand multiplies u by B and adds into y's rows in place (each row belongs to one
segment, so no two programs write one element). Accumulation is float32.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _sgmv_kernel(
    x_ptr,
    rows_ptr,
    w_ptr,
    out_ptr,
    starts_ptr,
    slots_ptr,
    k_size,
    n_size,
    GATHER: tl.constexpr,
    ADD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    segment = tl.program_id(0)
    start = tl.load(starts_ptr + segment)
    end = tl.load(starts_ptr + segment + 1)
    first = start + tl.program_id(1) * BLOCK_M
    if first >= end:
        return
    slot = tl.load(slots_ptr + segment).to(tl.int64)
    m = first + tl.arange(0, BLOCK_M)
    m_mask = m < end
    m = tl.where(m_mask, m, start).to(tl.int64)
    row = tl.load(rows_ptr + m).to(tl.int64)  # the pass's row of each sorted entry
    if GATHER:  # shrink: the pass's rows in, the sorted rows out
        in_row = row
        out_row = m
    else:  # expand: the sorted rows in, added into the pass's rows
        in_row = m
        out_row = row
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < n_size
    kk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + in_row[:, None] * k_size + kk[None, :]
    w_ptrs = w_ptr + slot * k_size * n_size + kk[:, None] * n_size + n[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, k_size, BLOCK_K):
        k_mask = kk + k0 < k_size
        a = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * n_size
    out_ptrs = out_ptr + out_row[:, None] * n_size + n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if ADD:
        acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def sgmv(
    x: Any, rows: Any, weights: Any, out: Any, starts: Any, slots: Any, longest: int, shrink: bool
) -> None:
    """Per segment g (rows `starts[g]:starts[g+1]` of the sorted order, slot `slots[g]`):
    shrink: out[i] = x[rows[i]] @ weights[slot] (out [sorted rows, n]);
    expand: out[rows[i]] += x[i] @ weights[slot] (x [sorted rows, k], out [pass rows, n]).

    x and out contiguous, weights [slots, k, n], rows int64, starts int64 [segments + 1], slots
    int64 [segments]; `longest` is the most rows of one segment (the grid's row tiles).
    """
    k_size, n_size = weights.shape[1], weights.shape[2]
    block_m = 16
    block_n = min(64, max(16, triton.next_power_of_2(n_size)))
    block_k = min(64, max(16, triton.next_power_of_2(k_size)))
    grid = (slots.shape[0], triton.cdiv(longest, block_m), triton.cdiv(n_size, block_n))
    _sgmv_kernel[grid](
        x,
        rows,
        weights,
        out,
        starts,
        slots,
        k_size,
        n_size,
        GATHER=shrink,
        ADD=not shrink,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PRECISION="ieee" if str(x.dtype).endswith("float32") else "tf32",
    )
