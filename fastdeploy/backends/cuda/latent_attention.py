"""Multi-head latent attention (`Backend.latent_attention`) on the cuda backend's runtimes.

A layer's cache is one `[slots, lora + rope]` tensor (the latent c, then the rotated rotary key
k_r), in the backend dtype, paged as the other caches. The two paths of the cpu backend's
`latent_attention`, on the device:

- decodes, and sequences of up to `ABSORB_MAX_QUERIES` queries (speculative verify passes, short
  chunks): absorbed. q_nope goes through absorb_k into latent space (one batched matmul over
  the heads), the Triton kernel `triton_latent.latent_decode` attends over the paged latents
  directly (split-KV; each query over the positions up to its own), and the mixed latents go
  through absorb_v. Fixed shapes and no host reads in a decode step: a captured CUDA graph
  replays it.
- longer prompt chunks (prefix-cache hits and later chunks alike): expanded. The cached
  latents of those sequences are gathered block by block into a
  temporary paged layout, expanded once to per-head keys (c @ absorb_k[h].T, k_r) and values
  (c @ absorb_v[h].T, zero-padded to the key width), and the paged prefill kernel of
  `triton_attention` attends over them through a block table of that layout.

With the reference kernels (no Triton) both paths are framework ops over the reference
metadata's padded decode gather and prefill tiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.backends.cuda.attention_metadata import CudaBatch
from fastdeploy.backends.types import BatchLayout


def absorb_queries(rt: Any, q_nope: Any, absorb_k: Any) -> Any:
    """q_nope [n, heads, nope] -> the latent-space queries [n, heads, lora] (q_nope[h] @ absorb_k[h])."""
    return rt.permute(rt.matmul(rt.permute(q_nope, [1, 0, 2]), absorb_k), [1, 0, 2])


def absorb_output(rt: Any, mixed: Any, absorb_v: Any) -> Any:
    """Mixed latents [n, heads, lora] -> values [n, heads, v_dim] (mixed[h] @ absorb_v[h].T)."""
    return rt.permute(rt.matmul(rt.permute(mixed, [1, 0, 2]), rt.permute(absorb_v, [0, 2, 1])), [1, 0, 2])


def reference_latent_attention(
    rt: Any,
    q_nope: Any,
    q_rope: Any,
    store: Any,
    meta: Any,
    absorb_k: Any,
    absorb_v: Any,
    scale: float,
) -> Any:
    """Both paths in framework ops over `reference.ReferenceAttentionMetadata` (the cache is
    written already)."""
    tokens, heads, _ = q_nope.shape
    lora = absorb_k.shape[2]
    out = rt.zeros([tokens, heads, absorb_v.shape[1]], rt.dtype_name(q_nope))
    if meta.decode_rows is not None:
        count, width = meta.decode_rows.shape[0], meta.decode_width
        context = rt.index_select(store, meta.decode_slots).reshape([count, width, store.shape[1]])
        latent, k_rope = context[:, :, :lora], context[:, :, lora:]
        q_latent = absorb_queries(rt, rt.index_select(q_nope, meta.decode_rows), absorb_k)
        q_rot = rt.index_select(q_rope, meta.decode_rows)
        scores = rt.matmul(q_latent, rt.permute(latent, [0, 2, 1])) + rt.matmul(
            q_rot, rt.permute(k_rope, [0, 2, 1])
        )
        scores = scores * scale + meta.decode_mask.reshape([count, 1, width])
        mixed = rt.matmul(rt.softmax(scores, -1), latent)  # [decodes, heads, lora]
        rt.index_copy_(out, meta.decode_rows, absorb_output(rt, mixed, absorb_v).contiguous())
    expanded: dict[int, tuple[Any, Any, Any]] = {}  # a prompt's tiles share its keys and values
    for tile in meta.prefill_tiles:
        if id(tile.slots) not in expanded:
            context = rt.index_select(store, tile.slots)
            latent = context[:, :lora]
            expanded[id(tile.slots)] = (
                rt.matmul(absorb_k, rt.permute(latent, [1, 0])),  # [heads, nope, ctx]
                rt.permute(context[:, lora:], [1, 0]),  # [rope, ctx]
                rt.matmul(latent, rt.permute(absorb_v, [0, 2, 1])),  # [heads, ctx, v_dim]
            )
        keys, k_rope, values = expanded[id(tile.slots)]
        queries = rt.permute(q_nope[tile.start : tile.end], [1, 0, 2])
        rotary = rt.permute(q_rope[tile.start : tile.end], [1, 0, 2])
        scores = (rt.matmul(queries, keys) + rt.matmul(rotary, k_rope)) * scale + tile.mask
        out[tile.start : tile.end] = rt.permute(rt.matmul(rt.softmax(scores, -1), values), [1, 0, 2])
    return out


#: a sequence with at most this many queries in a step is absorbed (decodes, speculative verify
#: passes, short prompt chunks): each query reads its sequence's latents itself, so the cost
#: grows with the queries; a longer chunk is expanded, paying nope + v_dim values per cached
#: position and head once for all its queries
ABSORB_MAX_QUERIES = 16


@dataclass
class LatentPlan:
    """How a step's sequences attend, built once a step (all layers share it): the absorbed
    queries (`entries` of them: token rows, their sequence, the positions each sees) and the
    expanded sequences' tiles of the paged prefill kernel and the gather of their cached blocks
    into a temporary paged layout."""

    entries: int
    rows: Any  # [entries] int64; None: token rows 0 .. entries - 1 in order (no expanded sequence)
    seqs: Any  # [entries] int32
    contexts: Any  # [entries] int32
    tile_seq: Any = None  # [tiles] int32 (None: nothing expanded)
    tile_offset: Any = None
    slots: Any = None  # [gathered] int64: the expanded sequences' cached blocks, in order
    block_tables: Any = None  # [sequences, blocks] int32 over the gathered slots


def latent_plan(rt: Any, layout: BatchLayout, tile_rows: int) -> LatentPlan:
    """The plan of a step from its host layout (`tile_rows`: the prefill kernel's query tile)."""
    lengths = layout.query_lens.astype(np.int64)
    contexts = layout.context_lens.astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    absorbed = np.flatnonzero(lengths <= ABSORB_MAX_QUERIES)
    counts = lengths[absorbed]
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    rows = np.repeat(starts[absorbed], counts) + within
    put = rt.from_numpy
    plan = LatentPlan(
        entries=int(rows.size),
        rows=None if rows.size == int(lengths.sum()) else put(rows),
        seqs=put(np.repeat(absorbed, counts).astype(np.int32)),
        contexts=put((np.repeat(contexts[absorbed] - counts + 1, counts) + within).astype(np.int32)),
    )
    expanded = np.flatnonzero(lengths > ABSORB_MAX_QUERIES)
    if expanded.size:
        tiles = -(-lengths[expanded] // tile_rows)
        plan.tile_seq = put(np.repeat(expanded, tiles).astype(np.int32))
        plan.tile_offset = put(np.concatenate([np.arange(n) * tile_rows for n in tiles]).astype(np.int32))
        block_size = layout.block_size
        blocks = -(-contexts[expanded] // block_size)
        firsts = np.concatenate([[0], np.cumsum(blocks)[:-1]])
        table = np.zeros((lengths.size, int(blocks.max())), np.int32)
        gathered = []
        for seq, first, count in zip(expanded.tolist(), firsts.tolist(), blocks.tolist(), strict=True):
            table[seq, :count] = first + np.arange(count)
            gathered.append(np.asarray(layout.block_tables[seq, :count], np.int64))
        slots = np.concatenate(gathered)[:, None] * block_size + np.arange(block_size)
        plan.slots, plan.block_tables = put(slots.reshape(-1)), put(table)
    return plan


def _graph_plan(batch: CudaBatch) -> LatentPlan:
    """A captured decode step's plan: decode i is token row i of sequence i (`cuda_graphs`), so
    the static buffers serve as they are and nothing comes from the host."""
    return LatentPlan(batch.num_decodes, None, batch.decode_seq, batch.seq_context_len)


def _widen(rt: Any, x: Any, width: int) -> Any:
    """x [..., w] zero-padded to [..., width]."""
    if x.shape[-1] == width:
        return x
    return rt.concat([x, rt.zeros([*x.shape[:-1], width - x.shape[-1]], rt.dtype_name(x))], -1)


def _expanded(
    backend: Any,
    q_nope: Any,
    q_rope: Any,
    store: Any,
    batch: CudaBatch,
    plan: LatentPlan,
    absorb_k: Any,
    absorb_v: Any,
    scale: float,
) -> Any:
    """[tokens, heads, v_dim] with the expanded sequences' rows filled (the others undefined)."""
    rt, launch = backend.rt, backend.launch
    heads, nope, lora = absorb_k.shape
    v_dim, rope = absorb_v.shape[1], q_rope.shape[2]
    dtype = rt.dtype_name(q_nope)
    width = max(nope + rope, v_dim)
    context = rt.index_select(store, plan.slots)
    count, latent = context.shape[0], context[:, :lora]
    keys_nope = rt.matmul(latent, rt.permute(absorb_k.reshape([heads * nope, lora]), [1, 0]))
    k_rope = rt.zeros([count, heads, rope], dtype) + context[:, lora:].reshape([count, 1, rope])
    keys = _widen(rt, rt.concat([keys_nope.reshape([count, heads, nope]), k_rope], -1), width).contiguous()
    values = rt.matmul(latent, rt.permute(absorb_v.reshape([heads * v_dim, lora]), [1, 0]))
    values = _widen(rt, values.reshape([count, heads, v_dim]), width).contiguous()
    queries = _widen(rt, rt.concat([q_nope, q_rope], -1), width).contiguous()
    out = rt.empty([q_nope.shape[0], heads, width], dtype)
    launch(
        launch.attention.prefill_attention,
        queries,
        keys,
        values,
        out,
        plan.block_tables,
        batch.seq_query_start,
        batch.seq_query_len,
        batch.seq_context_len,
        plan.tile_seq,
        plan.tile_offset,
        scale,
        batch.block_size,
        launch.shared_memory,
    )
    return out[:, :, :v_dim].contiguous()


def _absorbed(
    backend: Any,
    q_nope: Any,
    q_rope: Any,
    store: Any,
    batch: CudaBatch,
    plan: LatentPlan,
    absorb_k: Any,
    absorb_v: Any,
    scale: float,
) -> Any:
    """[entries, heads, v_dim] of the absorbed queries (q_nope, q_rope: those rows only)."""
    rt, launch = backend.rt, backend.launch
    heads, lora = q_nope.shape[1], absorb_k.shape[2]
    splits = batch.num_splits
    key = f"latent_{plan.entries}x{heads}x{lora}"  # split-KV scratch, allocated by the first layer
    if key not in batch.scratch:
        size = plan.entries if splits > 1 else 1
        batch.scratch[key] = (
            rt.empty([size, heads, splits, lora], "float32"),
            rt.empty([size, heads, splits], "float32"),
        )
    partial, partial_lse = batch.scratch[key]
    mixed = rt.empty([plan.entries, heads, lora], rt.dtype_name(q_nope))
    launch(
        launch.latent.latent_decode,
        absorb_queries(rt, q_nope, absorb_k).contiguous(),
        q_rope.contiguous(),
        store,
        mixed,
        batch.block_tables,
        plan.seqs,
        plan.contexts,
        partial,
        partial_lse,
        scale,
        batch.block_size,
        splits,
    )
    return absorb_output(rt, mixed, absorb_v)


def triton_latent_attention(
    backend: Any,
    q_nope: Any,
    q_rope: Any,
    latent: Any,
    k_rope: Any,
    store: Any,
    batch: CudaBatch,
    absorb_k: Any,
    absorb_v: Any,
    scale: float,
) -> Any:
    """Both paths with the Triton kernels; a captured decode step touches no host data."""
    rt, launch = backend.rt, backend.launch
    launch(launch.latent.store_latent, latent.contiguous(), k_rope.contiguous(), store, batch.slot_mapping)
    if "latent_plan" not in batch.scratch:
        tile_rows = launch.attention.prefill_block_m(rt.dtype_name(q_nope) == "float32")
        batch.scratch["latent_plan"] = (
            _graph_plan(batch) if batch.layout is None else latent_plan(rt, batch.layout, tile_rows)
        )
    plan: LatentPlan = batch.scratch["latent_plan"]
    args = (store, batch, plan, absorb_k, absorb_v, scale)
    if plan.rows is None:  # every token absorbed, in order
        return _absorbed(backend, q_nope, q_rope, *args).contiguous()
    out = _expanded(backend, q_nope, q_rope, *args)
    if plan.entries:
        picked = (rt.index_select(q_nope, plan.rows), rt.index_select(q_rope, plan.rows))
        rt.index_copy_(out, plan.rows, _absorbed(backend, *picked, *args).contiguous())
    return out
