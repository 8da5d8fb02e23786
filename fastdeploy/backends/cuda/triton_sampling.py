"""Top-k / top-p sampling in Triton without sorting or bisecting the whole vocabulary.

The definition (shared with `conformance.numpy_reference.sample_top_k_top_p`): scale the logits
by 1/temperature, keep the top-k (ties at the k-th value kept), keep the smallest set of most
likely tokens whose mass reaches top_p of the kept mass, then draw by inverse CDF over the kept
tokens in vocabulary order with the row's uniform number (one per row, drawn by the engine from
the sequence's own generator, so a seeded request samples the same tokens in any batch).

How, in two passes over the logits and two small per-row kernels:

1. `_chunk_stats_kernel` (rows x groups of 4096 logits): the maximum of every CHUNK-wide chunk,
   and each group's max and sum of exp (for the row's softmax normaliser).
2. `_threshold_kernel` (rows): sorts the chunk maxima; the k-th largest of them, t0, is a lower
   bound of the row's k-th largest logit (k distinct chunks each hold a logit >= t0). With top-k
   off, k is CANDIDATES_WITHOUT_TOP_K.
3. `_gather_kernel` (rows x groups): compacts the logits >= t0 (a few times k of them) into a
   per-row buffer of CAPACITY entries.
4. `_pick_kernel` (rows): sorts the candidates, applies top-k and top-p exactly, and draws.
   Rows with top-k off and top-p 1 draw over the whole row from the group sums instead.

The candidates are a set of top logits, so the result is exact whenever they contain the kept
set: at least k candidates (top-k on), or candidates holding top_p of the row's mass (top-k
off). A row where that fails (more than CAPACITY candidates, or a flat distribution whose
nucleus is larger than the candidates) gets token -1, and the backend samples it on the host
with the same definition.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

#: logits compared per sorted candidate buffer (and the most candidates a row may have)
CAPACITY = 2048
#: how many chunk maxima bound the candidates when top-k is off (top-p only, or neither)
CANDIDATES_WITHOUT_TOP_K = 256
#: logits a stats / gather program reads
GROUP_SIZE = 4096
#: warps of every sampling kernel (the per-row sorts of 2048 keys want the whole register file)
SAMPLING_WARPS = 8


def capacity(vocab: int) -> int:
    """Candidate buffer length: CAPACITY, or the vocabulary rounded up when it is smaller."""
    return min(CAPACITY, max(triton.next_power_of_2(vocab), 16))


def chunk_size(vocab: int) -> int:
    """Chunk width: about 1024 chunks per row, 16 to 128 logits each."""
    return min(max(triton.next_power_of_2(max(vocab // 1024, 1)), 16), 128)


@triton.jit
def _scaled_tile(
    logits_ptr, row, vocab, inv_temperature, start, GROUP_CHUNKS: tl.constexpr, CHUNK: tl.constexpr
):
    """Logits [GROUP_CHUNKS, CHUNK] from `start` of one row, divided by the temperature."""
    cols = start + tl.arange(0, GROUP_CHUNKS)[:, None] * CHUNK + tl.arange(0, CHUNK)[None, :]
    x = tl.load(logits_ptr + row * vocab + cols, mask=cols < vocab, other=float("-inf"))
    return x.to(tl.float32) * inv_temperature, cols


@triton.jit
def _chunk_stats_kernel(
    logits_ptr,
    temperature_ptr,
    chunk_max_ptr,
    group_max_ptr,
    group_sum_ptr,
    vocab,
    num_chunks,
    num_groups,
    CHUNKS_PAD: tl.constexpr,
    GROUP_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    inv_temperature = 1.0 / tl.load(temperature_ptr + row)
    x, _ = _scaled_tile(
        logits_ptr, row, vocab, inv_temperature, group * GROUP_CHUNKS * CHUNK, GROUP_CHUNKS, CHUNK
    )
    chunk_max = tl.max(x, axis=1)
    chunks = group * GROUP_CHUNKS + tl.arange(0, GROUP_CHUNKS)
    tl.store(chunk_max_ptr + row * CHUNKS_PAD + chunks, chunk_max, mask=chunks < num_chunks)
    top = tl.max(chunk_max, axis=0)
    safe_top = tl.where(top == float("-inf"), 0.0, top)
    tl.store(group_max_ptr + row * num_groups + group, top)
    tl.store(group_sum_ptr + row * num_groups + group, tl.sum(tl.sum(tl.exp(x - safe_top), axis=1), axis=0))


@triton.jit
def _element(x, i, N: tl.constexpr):
    """x[i] of a 1-D tensor for a runtime index i."""
    return tl.sum(tl.where(tl.arange(0, N) == i, x, tl.zeros_like(x)), axis=0)


@triton.jit
def _threshold_kernel(
    chunk_max_ptr,
    group_max_ptr,
    group_sum_ptr,
    top_k_ptr,
    threshold_ptr,
    row_max_ptr,
    row_sum_ptr,
    vocab,
    num_chunks,
    num_groups,
    CHUNKS_PAD: tl.constexpr,
    GROUPS_PAD: tl.constexpr,
    DEFAULT_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, CHUNKS_PAD)
    maxima = tl.load(chunk_max_ptr + row * CHUNKS_PAD + c, mask=c < num_chunks, other=float("-inf"))
    ordered = tl.sort(maxima, descending=True)
    top_k = tl.load(top_k_ptr + row)
    k = tl.where((top_k > 0) & (top_k < vocab), top_k, DEFAULT_K)
    k = tl.minimum(k, num_chunks)
    tl.store(threshold_ptr + row, _element(ordered, k - 1, CHUNKS_PAD))
    g = tl.arange(0, GROUPS_PAD)
    g_mask = g < num_groups
    group_max = tl.load(group_max_ptr + row * num_groups + g, mask=g_mask, other=float("-inf"))
    group_sum = tl.load(group_sum_ptr + row * num_groups + g, mask=g_mask, other=0.0)
    top = tl.max(group_max, axis=0)
    tl.store(row_max_ptr + row, top)
    tl.store(row_sum_ptr + row, tl.sum(tl.where(g_mask, group_sum * tl.exp(group_max - top), 0.0), axis=0))


@triton.jit
def _gather_kernel(
    logits_ptr,
    temperature_ptr,
    threshold_ptr,
    count_ptr,
    cand_value_ptr,
    cand_index_ptr,
    vocab,
    CAPACITY: tl.constexpr,
    GROUP_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    inv_temperature = 1.0 / tl.load(temperature_ptr + row)
    threshold = tl.load(threshold_ptr + row)
    x, cols = _scaled_tile(
        logits_ptr, row, vocab, inv_temperature, group * GROUP_CHUNKS * CHUNK, GROUP_CHUNKS, CHUNK
    )
    x = tl.reshape(x, [GROUP_CHUNKS * CHUNK])
    cols = tl.reshape(cols, [GROUP_CHUNKS * CHUNK])
    take = (x >= threshold) & (cols < vocab) & (x > float("-inf"))
    found = tl.sum(take.to(tl.int32), axis=0)
    if found > 0:
        base = tl.atomic_add(count_ptr + row, found)
        slots = base + tl.cumsum(take.to(tl.int32), axis=0) - 1
        keep = take & (slots < CAPACITY)
        tl.store(cand_value_ptr + row * CAPACITY + slots, x, mask=keep)
        tl.store(cand_index_ptr + row * CAPACITY + slots, cols, mask=keep)


@triton.jit
def _sortable(x):
    """int64 keys ordered like the float32 values x (larger value, larger key)."""
    bits = x.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _unsortable(key32):
    bits = key32 ^ ((key32 >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pick_kernel(
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    uniform_ptr,
    count_ptr,
    cand_value_ptr,
    cand_index_ptr,
    group_max_ptr,
    group_sum_ptr,
    row_max_ptr,
    row_sum_ptr,
    out_ptr,
    vocab,
    num_groups,
    CAPACITY: tl.constexpr,
    GROUPS_PAD: tl.constexpr,
    GROUP_CHUNKS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    uniform = tl.load(uniform_ptr + row)
    count = tl.load(count_ptr + row)
    row_max = tl.load(row_max_ptr + row)
    row_sum = tl.load(row_sum_ptr + row)
    use_k = (top_k > 0) & (top_k < vocab)
    full_row = (use_k == 0) & (top_p >= 1.0)

    # --- candidates, most likely first (ties: lower token id first) --------------------------
    j = tl.arange(0, CAPACITY)
    valid = j < tl.minimum(count, CAPACITY)
    values = tl.load(cand_value_ptr + row * CAPACITY + j, mask=valid, other=float("-inf"))
    index = tl.load(cand_index_ptr + row * CAPACITY + j, mask=valid, other=vocab)
    # empty slots hold -inf, below every candidate (candidates are finite): they sort last
    keys = tl.sort((_sortable(values) << 32) | (0xFFFFFFFF - index.to(tl.int64)), descending=True)
    values = _unsortable((keys >> 32).to(tl.int32))
    index = (0xFFFFFFFF - (keys & 0xFFFFFFFF)).to(tl.int32)
    kth = _element(values, tl.maximum(top_k - 1, 0), CAPACITY)
    keep = valid & (values >= tl.where(use_k, kth, float("-inf")))
    probs = tl.where(keep, tl.exp(values - row_max), 0.0)
    kept_mass = tl.sum(probs, axis=0)
    cumulative = tl.cumsum(probs, axis=0)
    # top-p of the kept mass: the top-k set's (inside the candidates), else the whole row's
    nucleus_mass = top_p * tl.where(use_k, kept_mass, row_sum)
    nucleus_end = tl.sum((cumulative < nucleus_mass).to(tl.int32), axis=0)  # last kept position
    keep = keep & (j <= tl.where(top_p >= 1.0, CAPACITY, nucleus_end))
    # inverse CDF in vocabulary order: re-sort the kept tokens by id, carrying their probability
    probs = tl.where(keep, probs, 0.0)
    by_id = tl.where(keep, (index.to(tl.int64) << 32) | probs.to(tl.int32, bitcast=True).to(tl.int64), 2**62)
    by_id = tl.sort(by_id, descending=False)
    kept = by_id < 2**62
    ids = (by_id >> 32).to(tl.int32)
    id_probs = tl.where(kept, (by_id & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True), 0.0)
    running = tl.cumsum(id_probs, axis=0)
    target = uniform * tl.sum(id_probs, axis=0)
    chosen = tl.min(tl.where(kept & (running > target), ids, vocab), axis=0)
    last = tl.max(tl.where(kept, ids, -1), axis=0)
    token = tl.where(chosen < vocab, chosen, last)

    # --- exactness: the candidates must contain the kept set -----------------------------------
    complete = count <= CAPACITY
    complete = complete & tl.where(use_k, count >= top_k, kept_mass >= top_p * row_sum)

    # --- top-k off and top-p 1: inverse CDF over the whole row from the group sums ----------------
    g = tl.arange(0, GROUPS_PAD)
    g_mask = (g < num_groups) & full_row
    group_max = tl.load(group_max_ptr + row * num_groups + g, mask=g_mask, other=float("-inf"))
    group_sum = tl.load(group_sum_ptr + row * num_groups + g, mask=g_mask, other=0.0)
    weights = tl.where(g_mask, group_sum * tl.exp(group_max - row_max), 0.0)
    group_running = tl.cumsum(weights, axis=0)
    full_target = uniform * tl.sum(weights, axis=0)
    hit_group = tl.min(tl.where(g_mask & (group_running > full_target), g, GROUPS_PAD), axis=0)
    hit_group = tl.where(hit_group < GROUPS_PAD, hit_group, tl.max(tl.where(weights > 0, g, 0), axis=0))
    before = _element(group_running - weights, hit_group, GROUPS_PAD)
    inv_temperature = 1.0 / tl.load(temperature_ptr + row)
    x, cols = _scaled_tile(
        logits_ptr,
        row,
        tl.where(full_row, vocab, 0),
        inv_temperature,
        hit_group * GROUP_CHUNKS * CHUNK,
        GROUP_CHUNKS,
        CHUNK,
    )
    x = tl.reshape(x, [GROUP_CHUNKS * CHUNK])
    cols = tl.reshape(cols, [GROUP_CHUNKS * CHUNK])
    p = tl.exp(x - row_max)
    inside = tl.cumsum(p, axis=0) + before
    full_chosen = tl.min(tl.where((p > 0) & (inside > full_target), cols, vocab), axis=0)
    full_last = tl.max(tl.where(p > 0, cols, -1), axis=0)
    full_token = tl.where(full_chosen < vocab, full_chosen, full_last)

    token = tl.where(full_row, full_token, tl.where(complete, token, -1))
    tl.store(out_ptr + row, token.to(tl.int64))


def sample_top_k_top_p(
    logits: Any,
    temperatures: Any,
    top_k: Any,
    top_p: Any,
    uniforms: Any,
    out: Any,
    scratch: dict[str, Any],
    max_candidates: int | None = None,
) -> None:
    """One token id per row of logits [rows, vocab] into out [rows] (int64), -1 where the row
    must be sampled on the host (see the module docstring).

    temperatures [rows] float32 > 0, top_k [rows] int32 (0 or >= vocab: off), top_p [rows]
    float32 in (0, 1], uniforms [rows] float32 in [0, 1). `scratch` holds the buffers that
    `scratch_shapes` describes, `count` zeroed; `max_candidates` (a power of two, default
    `capacity(vocab)`) must match the one given to `scratch_shapes`.
    """
    rows, vocab = logits.shape
    cap = max_candidates or capacity(vocab)
    chunk = chunk_size(vocab)
    group_chunks = GROUP_SIZE // chunk
    num_chunks = triton.cdiv(vocab, chunk)
    num_groups = triton.cdiv(num_chunks, group_chunks)
    chunks_pad = max(triton.next_power_of_2(num_chunks), 2)
    groups_pad = max(triton.next_power_of_2(num_groups), 2)
    _chunk_stats_kernel[(rows, num_groups)](
        logits,
        temperatures,
        scratch["chunk_max"],
        scratch["group_max"],
        scratch["group_sum"],
        vocab,
        num_chunks,
        num_groups,
        CHUNKS_PAD=chunks_pad,
        GROUP_CHUNKS=group_chunks,
        CHUNK=chunk,
        num_warps=SAMPLING_WARPS,
    )
    _threshold_kernel[(rows,)](
        scratch["chunk_max"],
        scratch["group_max"],
        scratch["group_sum"],
        top_k,
        scratch["threshold"],
        scratch["row_max"],
        scratch["row_sum"],
        vocab,
        num_chunks,
        num_groups,
        CHUNKS_PAD=chunks_pad,
        GROUPS_PAD=groups_pad,
        DEFAULT_K=CANDIDATES_WITHOUT_TOP_K,
        num_warps=SAMPLING_WARPS,
    )
    _gather_kernel[(rows, num_groups)](
        logits,
        temperatures,
        scratch["threshold"],
        scratch["count"],
        scratch["cand_value"],
        scratch["cand_index"],
        vocab,
        CAPACITY=cap,
        GROUP_CHUNKS=group_chunks,
        CHUNK=chunk,
        num_warps=SAMPLING_WARPS,
    )
    _pick_kernel[(rows,)](
        logits,
        temperatures,
        top_k,
        top_p,
        uniforms,
        scratch["count"],
        scratch["cand_value"],
        scratch["cand_index"],
        scratch["group_max"],
        scratch["group_sum"],
        scratch["row_max"],
        scratch["row_sum"],
        out,
        vocab,
        num_groups,
        CAPACITY=cap,
        GROUPS_PAD=groups_pad,
        GROUP_CHUNKS=group_chunks,
        CHUNK=chunk,
        num_warps=SAMPLING_WARPS,
    )


def scratch_shapes(
    rows: int, vocab: int, max_candidates: int | None = None
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shapes and dtypes of the scratch buffers of `sample_top_k_top_p` (`count` must be zeros)."""
    cap = max_candidates or capacity(vocab)
    chunk = chunk_size(vocab)
    num_chunks = triton.cdiv(vocab, chunk)
    num_groups = triton.cdiv(num_chunks, GROUP_SIZE // chunk)
    return {
        "chunk_max": ((rows, max(triton.next_power_of_2(num_chunks), 2)), "float32"),
        "group_max": ((rows, num_groups), "float32"),
        "group_sum": ((rows, num_groups), "float32"),
        "threshold": ((rows,), "float32"),
        "row_max": ((rows,), "float32"),
        "row_sum": ((rows,), "float32"),
        "count": ((rows,), "int32"),
        "cand_value": ((rows, cap), "float32"),
        "cand_index": ((rows, cap), "int32"),
    }
