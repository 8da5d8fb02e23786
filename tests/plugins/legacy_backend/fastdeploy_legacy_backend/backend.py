"""Every abstract method of the 0.1 `Backend` in plain numpy, plus two optional features the 0.1
way: `samples_on_device = True` with `sample_top_k_top_p`, and an overridden `copy_kv_blocks`."""

from __future__ import annotations

import numpy as np

from fastdeploy.plugins.api import Backend, BatchLayout, KVCacheSpec


class LegacyNumpyBackend(Backend):
    name = "legacy-numpy"
    auto_priority = -50  # never chosen by device="auto"
    samples_on_device = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    # memory
    def free_memory_bytes(self) -> int:
        return 1 << 30

    def allocate_kv_cache(self, spec: KVCacheSpec) -> list:
        shape = (spec.num_blocks * spec.block_size, spec.num_kv_heads, spec.head_dim)
        return [(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(spec.num_layers)]

    def copy_kv_blocks(self, kv_caches: list, pairs: np.ndarray, block_size: int) -> None:
        for layer in kv_caches:
            for cache in layer:
                blocks = cache.reshape(-1, block_size, *cache.shape[1:])
                blocks[pairs[:, 1]] = blocks[pairs[:, 0]]

    # data
    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        array = np.asarray(array)
        return array.astype(np.float32) if np.issubdtype(array.dtype, np.floating) else array

    def to_numpy(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def linear_weight(self, *parts: np.ndarray) -> np.ndarray:
        return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts]).T.copy()

    def linear_bias(self, *parts: np.ndarray) -> np.ndarray:
        return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])

    def prepare_batch(self, layout: BatchLayout) -> BatchLayout:
        return layout

    # ops
    def embedding(self, token_ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        return table[token_ids]

    def linear(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        out = x @ weight
        return out + bias if bias is not None else out

    def rms_norm(self, x, weight, eps, residual=None):
        if residual is not None:
            x = x + residual
        scale = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + np.float32(eps))
        return (x * scale * weight).astype(np.float32), x

    def layer_norm(self, x, weight, bias, eps, residual=None):
        if residual is not None:
            x = x + residual
        centered = x - x.mean(axis=-1, keepdims=True)
        out = (
            centered / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + np.float32(eps)) * weight
        )
        return (out + bias if bias is not None else out).astype(np.float32), x

    def rotary_embedding(self, x, positions, cos, sin):
        half = cos.shape[-1]
        c, s = cos[positions][:, None, :], sin[positions][:, None, :]
        out = x.copy()
        first, second = x[..., :half], x[..., half : 2 * half]
        out[..., :half] = first * c - second * s
        out[..., half : 2 * half] = second * c + first * s
        return out

    def silu_and_mul(self, x: np.ndarray) -> np.ndarray:
        half = x.shape[-1] // 2
        gate = x[:, :half]
        return gate / (1.0 + np.exp(-gate)) * x[:, half:]

    def gelu_tanh(self, x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (x + 0.044715 * x**3)))

    def attention(self, q, k, v, kv_cache, batch: BatchLayout, scale: float) -> np.ndarray:
        keys, values = kv_cache
        keys[batch.slot_mapping], values[batch.slot_mapping] = k, v
        out = np.empty_like(q)
        group = q.shape[1] // k.shape[1]
        start = 0
        for length, context, table in zip(
            batch.query_lens, batch.context_lens, batch.block_tables, strict=True
        ):
            slots = (table[:, None] * batch.block_size + np.arange(batch.block_size)).reshape(-1)[:context]
            key, value = np.repeat(keys[slots], group, axis=1), np.repeat(values[slots], group, axis=1)
            for t in range(length):
                visible = context - length + t + 1
                scores = np.einsum("hd,shd->hs", q[start + t], key[:visible]) * np.float32(scale)
                weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
                weights /= weights.sum(axis=-1, keepdims=True)
                out[start + t] = np.einsum("hs,shd->hd", weights, value[:visible])
            start += length
        return out

    def gather_rows(self, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        return x[indices]

    # sampling on the "device"
    def sample_top_k_top_p(self, logits, temperatures, top_k, top_p, uniforms) -> np.ndarray:
        tokens = []
        for row, temperature, k, p, u in zip(logits, temperatures, top_k, top_p, uniforms, strict=True):
            x = row.astype(np.float64) / temperature
            keep = np.ones(x.size, dtype=bool)
            if 0 < k < x.size:
                keep &= x >= np.sort(x)[::-1][k - 1]
            probs = np.where(keep, np.exp(x - x.max()), 0.0)
            if p < 1.0:
                order = np.argsort(-probs, kind="stable")
                cut = int(np.searchsorted(np.cumsum(probs[order]) / probs.sum(), p)) + 1
                nucleus = np.zeros(x.size, dtype=bool)
                nucleus[order[:cut]] = True
                keep &= nucleus
            cumulative = np.cumsum(np.where(keep, probs, 0.0))
            tokens.append(int(np.searchsorted(cumulative, u * cumulative[-1], side="right")))
        return np.array(tokens, dtype=np.int64)
