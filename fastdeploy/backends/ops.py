"""The ops part of the device contract: the primitives a model's forward pass calls.

Every op takes and returns the backend's device arrays (whatever type it chooses; they support
slicing, `.reshape`, `.shape` and `+`). Shapes use `tokens` for the flattened batch of a pass
(see `BatchLayout`). The optional ops a backend may fuse or move to the device are grouped by
`Capability` on `Backend`; these are the ones every backend implements.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from fastdeploy.backends.types import BatchLayout, KVCacheSpec


class DeviceOps(ABC):
    """Arrays, weights, the paged KV cache and the ops models are written against."""

    # --- KV memory --------------------------------------------------------------------------
    @abstractmethod
    def allocate_kv_cache(self, spec: KVCacheSpec) -> list[Any]:
        """One opaque KV-cache object per layer, passed back to `attention`."""

    # --- data movement --------------------------------------------------------------------
    @abstractmethod
    def from_numpy(self, array: np.ndarray) -> Any:
        """Device array holding `array` (converted to the backend dtype if floating)."""

    @abstractmethod
    def to_numpy(self, array: Any) -> np.ndarray:
        """Host float32/int64 copy (or view) of a device array."""

    @abstractmethod
    def linear_weight(self, *parts: np.ndarray) -> Any:
        """Device weight for `linear` from [out, in] matrices stacked along `out` (fused projections)."""

    def encoder_linear_weight(self, *parts: np.ndarray) -> Any:
        """`linear_weight` for a vision encoder's linear layers (default: the same). A backend may
        keep these in another precision on request (the cpu backend's `FD_CPU_VISION_MATMUL`):
        an encoder runs once per image, so its products are large and arithmetic-bound."""
        return self.linear_weight(*parts)

    @abstractmethod
    def linear_bias(self, *parts: np.ndarray) -> Any:
        """Device bias for `linear` from 1-D parts concatenated (matching `linear_weight`'s fusion)."""

    @abstractmethod
    def prepare_batch(self, layout: BatchLayout) -> Any:
        """Backend-specific attention metadata for one forward pass, shared by all layers."""

    # --- ops --------------------------------------------------------------------------------
    @abstractmethod
    def embedding(self, token_ids: Any, table: Any) -> Any:
        """Rows of `table` for `token_ids`: [num_tokens, hidden]."""

    @abstractmethod
    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        """x [tokens, in] @ W.T (+ bias) -> [tokens, out], for a weight built by `linear_weight`."""

    @abstractmethod
    def rms_norm(self, x: Any, weight: Any, eps: float, residual: Any | None = None) -> tuple[Any, Any]:
        """RMSNorm of (x + residual) over the last axis, x [rows, hidden] and weight [hidden]; returns
        (normed, new residual), both [rows, hidden] (the new residual is x + residual, or x)."""

    @abstractmethod
    def rotary_embedding(self, x: Any, positions: Any, cos: Any, sin: Any) -> Any:
        """Rotate-half (NeoX / HF Llama) rotary embedding of x [tokens, heads, head_dim] -> same shape,
        at `positions` [tokens] int64 of the tables cos / sin [max_positions, rotary_dim / 2]; dims
        past rotary_dim pass through (partial rotary)."""

    @abstractmethod
    def silu_and_mul(self, x: Any) -> Any:
        """silu(x[:, :d]) * x[:, d:] for x [tokens, 2d] -> [tokens, d]."""

    @abstractmethod
    def layer_norm(
        self, x: Any, weight: Any, bias: Any | None, eps: float, residual: Any | None = None
    ) -> tuple[Any, Any]:
        """LayerNorm (mean and variance over the last axis) of (x + residual); (normed, new residual)."""

    @abstractmethod
    def gelu_tanh(self, x: Any) -> Any:
        """GELU with the tanh approximation (GPT-2's `gelu_new`, PyTorch's approximate="tanh"),
        elementwise."""

    @abstractmethod
    def attention(self, q: Any, k: Any, v: Any, kv_cache: Any, batch: Any, scale: float) -> Any:
        """Write k/v into the paged cache, then causal attention of q over each sequence's cache.

        q [tokens, heads, head_dim], k/v [tokens, kv_heads, head_dim]; grouped-query attention when
        heads > kv_heads. Returns [tokens, heads, head_dim].
        """

    @abstractmethod
    def gather_rows(self, x: Any, indices: Any) -> Any:
        """x[indices] along the token axis: x [tokens, ...], indices [n] int64 -> [n, ...]."""
