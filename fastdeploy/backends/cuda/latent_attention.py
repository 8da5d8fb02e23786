"""Multi-head latent attention (`Backend.latent_attention`) on the cuda backend's runtimes.

A layer's cache is one `[slots, lora + rope]` tensor (the latent c, then the rotated rotary key
k_r), in the backend dtype, paged as the other caches. The two paths of the cpu backend's
`latent_attention`, on the device:

- decode (one query per sequence): absorbed. q_nope goes through absorb_k into latent space
  (one batched matmul over the heads), the Triton kernel `triton_latent.latent_decode` attends
  over the paged latents directly (split-KV), and the mixed latents go through absorb_v. Fixed
  shapes and no host reads: a captured CUDA decode graph replays it.
- prefill chunks (several queries; prefix-cache hits and later chunks alike): expanded. The
  cached latents of the step's prefilling sequences are gathered block by block into a
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


@dataclass
class ExpandedLayout:
    """Where the step's prefilling sequences' contexts lie in the temporary expanded keys and
    values: whole cache blocks gathered in order (`slots`, device int64) and a block table over
    them (`block_tables`, device int32, a row per sequence of the step)."""

    slots: Any
    block_tables: Any


def expanded_layout(rt: Any, layout: BatchLayout, block_size: int) -> ExpandedLayout:
    """The gather of every prefilling sequence's cached blocks, built on the host once a step."""
    prefills = np.flatnonzero(layout.query_lens > 1)
    blocks = -(-layout.context_lens[prefills].astype(np.int64) // block_size)
    firsts = np.concatenate([[0], np.cumsum(blocks)[:-1]]).astype(np.int64)
    table = np.zeros((layout.query_lens.size, max(int(blocks.max()), 1)), np.int32)
    gathered = []
    for seq, first, count in zip(prefills.tolist(), firsts.tolist(), blocks.tolist(), strict=True):
        table[seq, :count] = first + np.arange(count)
        gathered.append(np.asarray(layout.block_tables[seq, :count], np.int64))
    slots = (np.concatenate(gathered)[:, None] * block_size + np.arange(block_size)).reshape(-1)
    return ExpandedLayout(rt.from_numpy(slots), rt.from_numpy(table))


def _widen(rt: Any, x: Any, width: int) -> Any:
    """x [..., w] zero-padded to [..., width]."""
    if x.shape[-1] == width:
        return x
    return rt.concat([x, rt.zeros([*x.shape[:-1], width - x.shape[-1]], rt.dtype_name(x))], -1)


def _expanded_prefill(
    backend: Any,
    q_nope: Any,
    q_rope: Any,
    store: Any,
    batch: CudaBatch,
    absorb_k: Any,
    absorb_v: Any,
    scale: float,
) -> Any:
    """[tokens, heads, v_dim] with the prefill rows filled (the others undefined)."""
    rt, launch = backend.rt, backend.launch
    if "latent_prefill" not in batch.scratch:
        batch.scratch["latent_prefill"] = expanded_layout(rt, batch.layout, batch.block_size)
    where: ExpandedLayout = batch.scratch["latent_prefill"]
    heads, nope, lora = absorb_k.shape
    v_dim, rope = absorb_v.shape[1], q_rope.shape[2]
    dtype = rt.dtype_name(q_nope)
    width = max(nope + rope, v_dim)
    context = rt.index_select(store, where.slots)
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
        where.block_tables,
        batch.seq_query_start,
        batch.seq_query_len,
        batch.seq_context_len,
        batch.tile_seq,
        batch.tile_offset,
        scale,
        batch.block_size,
        launch.shared_memory,
    )
    return out[:, :, :v_dim].contiguous()


def _absorbed_decode(
    backend: Any,
    q_nope: Any,
    q_rope: Any,
    store: Any,
    batch: CudaBatch,
    absorb_k: Any,
    absorb_v: Any,
    scale: float,
) -> Any:
    """[decodes, heads, v_dim] of the decode rows (q_nope, q_rope: those rows only)."""
    rt, launch = backend.rt, backend.launch
    count, heads, _ = q_nope.shape
    lora = absorb_k.shape[2]
    splits = batch.num_splits
    key = f"latent_{heads}x{lora}"  # split-KV scratch, allocated by the first layer
    if key not in batch.scratch:
        size = count if splits > 1 else 1
        batch.scratch[key] = (
            rt.empty([size, heads, splits, lora], "float32"),
            rt.empty([size, heads, splits], "float32"),
        )
    partial, partial_lse = batch.scratch[key]
    mixed = rt.empty([count, heads, lora], rt.dtype_name(q_nope))
    launch(
        launch.latent.latent_decode,
        absorb_queries(rt, q_nope, absorb_k).contiguous(),
        q_rope.contiguous(),
        store,
        mixed,
        batch.block_tables,
        batch.decode_seq,
        batch.seq_context_len,
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
    """Both paths with the Triton kernels; a decode-only step (token row i is decode i, as in a
    captured graph) touches no host data."""
    rt, launch = backend.rt, backend.launch
    launch(launch.latent.store_latent, latent.contiguous(), k_rope.contiguous(), store, batch.slot_mapping)
    if not batch.num_prefill_tiles:
        return _absorbed_decode(backend, q_nope, q_rope, store, batch, absorb_k, absorb_v, scale).contiguous()
    out = _expanded_prefill(backend, q_nope, q_rope, store, batch, absorb_k, absorb_v, scale)
    if batch.num_decodes:
        rows = rt.cast(batch.decode_token, "int64")
        decoded = _absorbed_decode(
            backend,
            rt.index_select(q_nope, rows),
            rt.index_select(q_rope, rows),
            store,
            batch,
            absorb_k,
            absorb_v,
            scale,
        )
        rt.index_copy_(out, rows, decoded.contiguous())
    return out
