"""Multi-head latent attention (`Backend.latent_attention`) on the host with numpy.

The cache holds one vector per token: the compressed latent c (kv_lora_rank wide) and the
rotated rotary key k_r. Per sequence:

- absorbed (decode, and short speculative verify passes): the query's no-rope part is carried
  into latent space, q_c = q_nope @ W_UK (per head), so scores are q_c . c + q_rope . k_r
  straight from the cache; the probabilities mix the latents, and W_UV takes the mix to each
  head's value space. No per-head key or value of the context is formed.
- expanded (prefill): the context's latents become per-head keys c @ W_UK.T and values
  c @ W_UV.T once, shared by all the queries.

`absorbs` picks the cheaper of the two for a sequence's query count.

Both paths serve either metadata form of the cpu backend (numpy's `CpuAttentionMetadata`, the
native kernels' `AttentionBatch`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.backends.cpu.attention import CpuAttentionMetadata, context_slots
from fastdeploy.backends.cpu.kv_cache import LatentKVCache

_NEG_INF = np.float32(-np.inf)


def _softmax(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _sequences(batch: Any) -> Iterator[tuple[int, int, np.ndarray]]:
    """(first token row, row past the last, cache slots of the whole context) of each sequence."""
    if isinstance(batch, CpuAttentionMetadata):
        lengths = (batch.decode_mask[:, 0, 0, :] == 0).sum(axis=1).tolist()
        for row, slots, length in zip(batch.decode_rows.tolist(), batch.decode_slots, lengths, strict=True):
            yield row, row + 1, slots[:length]
        for piece in batch.prefills:
            yield piece.token_start, piece.token_end, piece.slots
        return
    starts = batch.query_starts.tolist()
    for i, length in enumerate(batch.context_lens.tolist()):
        yield starts[i], starts[i + 1], context_slots(batch.block_tables[i], length, batch.block_size)


def _causal_mask(length: int, context: int) -> np.ndarray:
    """[L, ctx] 0 / -inf: the last `length` positions of a context attend to those up to theirs."""
    positions = context - length + np.arange(length)
    return np.where(np.arange(context)[None, :] > positions[:, None], _NEG_INF, np.float32(0))


def absorbed_attention(
    q_nope: np.ndarray,
    q_rope: np.ndarray,
    latent: np.ndarray,
    k_rope: np.ndarray,
    absorb_k: np.ndarray,
    absorb_v: np.ndarray,
    scale: float,
) -> np.ndarray:
    """The last L positions of a context as causal queries (q_nope [L, heads, nope], q_rope
    [L, heads, rope]) over its latents [ctx, lora] and rotary keys [ctx, rope] -> [L, heads,
    v_dim], through the latent space: no per-head key or value is formed."""
    q_latent = np.matmul(q_nope.transpose(1, 0, 2), absorb_k)  # [heads, L, lora]
    scores = np.matmul(q_latent, latent.T)  # [heads, L, ctx]
    scores += np.matmul(q_rope.transpose(1, 0, 2), k_rope.T)
    scores *= np.float32(scale)
    if q_nope.shape[0] > 1:
        scores += _causal_mask(q_nope.shape[0], latent.shape[0])
    mixed = np.matmul(_softmax(scores), latent)  # [heads, L, lora]
    return np.matmul(mixed, absorb_v.transpose(0, 2, 1)).transpose(1, 0, 2)


def expanded_attention(
    q_nope: np.ndarray,
    q_rope: np.ndarray,
    latent: np.ndarray,
    k_rope: np.ndarray,
    absorb_k: np.ndarray,
    absorb_v: np.ndarray,
    scale: float,
) -> np.ndarray:
    """`absorbed_attention`'s result through per-head keys and values: the context's latents
    are expanded once, [heads, nope, ctx] keys and [heads, ctx, v_dim] values, shared by the
    queries."""
    keys = np.matmul(absorb_k, latent.T)  # [heads, nope, ctx]
    values = np.matmul(latent, absorb_v.transpose(0, 2, 1))  # [heads, ctx, v]
    scores = np.matmul(q_nope.transpose(1, 0, 2), keys)  # [heads, L, ctx]
    scores += np.matmul(q_rope.transpose(1, 0, 2), k_rope.T)
    scores *= np.float32(scale)
    scores += _causal_mask(q_nope.shape[0], latent.shape[0])
    return np.matmul(_softmax(scores), values).transpose(1, 0, 2)


def absorbs(length: int, lora: int, rope: int, nope: int, v_dim: int) -> bool:
    """Whether `length` queries are cheaper absorbed than expanded. Per cached position and head,
    expanding forms nope + v_dim values from lora, then L dot products over nope + rope and v_dim;
    absorbing does L over lora + rope and lora. Decode (L = 1) always absorbs; a speculative
    verify pass of a few queries does too; a prompt expands."""
    return length * (2 * lora + rope) <= (nope + v_dim) * lora + length * (nope + rope + v_dim)


def latent_attention(
    q_nope: np.ndarray,
    q_rope: np.ndarray,
    latent: np.ndarray,
    k_rope: np.ndarray,
    cache: LatentKVCache,
    batch: Any,
    absorb_k: np.ndarray,
    absorb_v: np.ndarray,
    scale: float,
) -> np.ndarray:
    """See `Backend.latent_attention`."""
    store = cache.latent
    lora = latent.shape[1]
    slots = batch.slot_mapping
    store[slots, :lora] = latent
    store[slots, lora:] = k_rope
    tokens, heads, nope = q_nope.shape
    v_dim = absorb_v.shape[1]
    out = np.empty((tokens, heads, v_dim), np.float32)
    for start, end, context_slots_ in _sequences(batch):
        context = store[context_slots_].astype(np.float32)
        c, rope = context[:, :lora], context[:, lora:]
        path = (
            absorbed_attention
            if absorbs(end - start, lora, rope.shape[1], nope, v_dim)
            else expanded_attention
        )
        out[start:end] = path(q_nope[start:end], q_rope[start:end], c, rope, absorb_k, absorb_v, scale)
    return out
