"""Multi-head latent attention (`Backend.latent_attention`) on the host with numpy.

The cache holds one vector per token: the compressed latent c (kv_lora_rank wide) and the
rotated rotary key k_r. Per sequence:

- one query token (decode): absorbed. The query's no-rope part is carried into latent space,
  q_c = q_nope @ W_UK (per head), so scores are q_c . c + q_rope . k_r straight from the cache;
  the probabilities mix the latents, and W_UV takes the mix to each head's value space. No
  per-head key or value of the context is formed.
- several query tokens (prefill, or a speculative verify pass): expanded. The context's latents
  become per-head keys c @ W_UK.T and values c @ W_UV.T once, shared by all the queries.

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


def absorbed_attention(
    q_nope: np.ndarray,
    q_rope: np.ndarray,
    latent: np.ndarray,
    k_rope: np.ndarray,
    absorb_k: np.ndarray,
    absorb_v: np.ndarray,
    scale: float,
) -> np.ndarray:
    """One query per head (q_nope [heads, nope], q_rope [heads, rope]) over a context's latents
    [ctx, lora] and rotary keys [ctx, rope] -> [heads, v_dim], through the latent space."""
    q_latent = np.matmul(q_nope[:, None, :], absorb_k)[:, 0]  # [heads, lora]
    scores = (q_latent @ latent.T + q_rope @ k_rope.T) * np.float32(scale)  # [heads, ctx]
    mixed = _softmax(scores) @ latent  # [heads, lora]
    return np.matmul(absorb_v, mixed[:, :, None])[:, :, 0]


def expanded_attention(
    q_nope: np.ndarray,
    q_rope: np.ndarray,
    latent: np.ndarray,
    k_rope: np.ndarray,
    absorb_k: np.ndarray,
    absorb_v: np.ndarray,
    scale: float,
) -> np.ndarray:
    """The last `L` positions of a context as causal queries (q_nope [L, heads, nope], q_rope
    [L, heads, rope]) over its per-head keys and values -> [L, heads, v_dim]."""
    length, context = q_nope.shape[0], latent.shape[0]
    keys = np.matmul(absorb_k, latent.T)  # [heads, nope, ctx]
    values = np.matmul(latent, absorb_v.transpose(0, 2, 1))  # [heads, ctx, v]
    scores = np.matmul(q_nope.transpose(1, 0, 2), keys)  # [heads, L, ctx]
    scores += np.matmul(q_rope.transpose(1, 0, 2), k_rope.T)
    scores *= np.float32(scale)
    positions = context - length + np.arange(length)
    scores += np.where(np.arange(context)[None, :] > positions[:, None], _NEG_INF, np.float32(0))
    return np.matmul(_softmax(scores), values).transpose(1, 0, 2)


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
    tokens, heads, _ = q_nope.shape
    out = np.empty((tokens, heads, absorb_v.shape[1]), np.float32)
    for start, end, context_slots_ in _sequences(batch):
        context = store[context_slots_].astype(np.float32)
        c, rope = context[:, :lora], context[:, lora:]
        if end - start == 1:
            out[start] = absorbed_attention(q_nope[start], q_rope[start], c, rope, absorb_k, absorb_v, scale)
        else:
            out[start:end] = expanded_attention(
                q_nope[start:end], q_rope[start:end], c, rope, absorb_k, absorb_v, scale
            )
    return out
