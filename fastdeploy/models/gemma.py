"""The decoder Gemma 2 and Gemma 3 (text) share, the base of `Gemma2ForCausalLM` and
`Gemma3ForCausalLM`.

A decoder with grouped-query attention like Llama's, differing in what the Llama class's
override points cannot express, so the layer and the forward pass are its own:

- RMSNorm weights are stored as offsets: the scale is (1 + w) (added once at load);
- four norms per layer: input, post-attention (on the attention output, before the residual
  add), pre-feed-forward and post-feed-forward;
- the MLP is GELU(tanh)(gate) * up;
- the embedding is scaled by sqrt(hidden_size); attention scores by `query_pre_attn_scalar`^-0.5;
  `head_dim` need not be hidden / heads;
- layers alternate sliding-window ("sliding_attention") and global ("full_attention") attention,
  by `layer_types` or a fixed pattern (`global_every`); each kind of layer has its rotary tables
  (`kind_rope`: one base for both in Gemma 2, two in Gemma 3);
- soft-capping where config.json sets it (Gemma 2): attention scores become
  `attn_logit_softcapping` * tanh(score / cap) before the softmax (`AttentionBlock.softcap`, on a
  backend with `Capability.ATTENTION_SOFTCAP`), the logits `final_logit_softcapping` * tanh(logit /
  cap) (`Backend.softcap`).

Past `sliding_window` the sliding layers attend over their window only (`AttentionBlock.window`,
on a backend with `Capability.SLIDING_WINDOW`). Runs in one process (no tensor or pipeline
parallelism).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.attention_window import SLIDING, sliding_layer_types
from fastdeploy.models.llama import LlamaForCausalLM, LlamaLayerWeights, ProjectionBiases
from fastdeploy.plugins.api import (
    Backend,
    Capability,
    InvalidArgumentError,
    ModelConfig,
    ModelParallel,
    UnsupportedModelError,
    layer_batch,
)

#: config.json's `layer_types` name of a global (full-attention) layer
GLOBAL = "full_attention"


def softcap_field(config: ModelConfig, name: str) -> float:
    """config.json's soft-capping `name` (`attn_logit_softcapping`, `final_logit_softcapping`):
    0.0 where absent or null, else a positive number."""
    value = config.raw.get(name)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidArgumentError(f"config.json: {name} must be a positive number or null, got {value!r}")
    return float(value)


def attention_logit_cap(config: ModelConfig, backend: Backend) -> float:
    """The attention scores' soft cap (0.0: none); raises UnsupportedModelError where there is
    one and `backend` lacks `Capability.ATTENTION_SOFTCAP` (the scores would differ everywhere,
    so no limit makes the model runnable without it)."""
    cap = softcap_field(config, "attn_logit_softcapping")
    if cap and not backend.supports(Capability.ATTENTION_SOFTCAP):
        raise UnsupportedModelError(
            f"{config.architecture} with attn_logit_softcapping={cap:g} needs attention logit "
            f"soft-capping, which the {backend.name} backend lacks (Capability.ATTENTION_SOFTCAP)"
        )
    return cap


@dataclass
class GemmaBlock:
    """A layer's parts beyond Llama's: the GELU MLP, its two norms, the layer's rotary tables."""

    gate: Any
    up: Any
    down: Any
    pre_feedforward_norm: Any
    post_feedforward_norm: Any
    cos: Any
    sin: Any


class GemmaDecoder(LlamaForCausalLM):
    """The Gemma 2 / Gemma 3 text decoder; subclasses say which layers slide, their rotary
    tables, and whether q/k carry norms."""

    supports_parallel = False

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        self.layer_types: list[str] = []
        self.attention_cap = attention_logit_cap(config, backend)
        super().__init__(config, backend, max_positions, parallel)
        self.final_softcap = softcap_field(config, "final_logit_softcapping")
        self.scale = float(config.raw.get("query_pre_attn_scalar") or config.head_dim) ** -0.5
        self.layer_types = sliding_layer_types(config, GLOBAL, self.global_every())
        self.tables: dict[str, tuple[Any, Any]] = {}

    # --- what Gemma 2 and Gemma 3 set apart ------------------------------------------------
    def global_every(self) -> int:
        """Without `layer_types`: every this-many-th layer is global, the others slide."""
        raise NotImplementedError

    def kind_rope(self, kind: str) -> tuple[Any, Any]:
        """Host (cos, sin) of the layers of `kind` (`SLIDING` or `GLOBAL`); one table for both here."""
        return self.rotary_tables(None)

    # --- Llama's override points --------------------------------------------------------------
    def attention_window(self, layer: int) -> int:
        return self.window if self.layer_types[layer] == SLIDING else 0

    def attention_softcap(self) -> float:
        return self.attention_cap

    def projection_biases(self) -> ProjectionBiases:
        attention = bool(self.config.raw.get("attention_bias", False))
        return ProjectionBiases(qkv=attention, o_proj=attention)

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        return super().mlp_names(layer, prefix) | {
            prefix + "pre_feedforward_layernorm.weight",
            prefix + "post_feedforward_layernorm.weight",
        }

    def preprocess_weights(self, host: dict[str, Any]) -> None:
        for name in [n for n in host if n.endswith("norm.weight")]:
            host[name] = np.asarray(host[name], dtype=np.float32) + np.float32(1.0)

    def load_mlp(self, layer: int, prefix: str, host: dict[str, Any]) -> GemmaBlock:
        backend = self.backend
        kind = self.layer_types[layer]
        if kind not in self.tables:
            cos, sin = self.kind_rope(kind)
            self.tables[kind] = (backend.from_numpy(cos), backend.from_numpy(sin))
        cos, sin = self.tables[kind]
        mlp = prefix + "mlp."
        return GemmaBlock(
            gate=backend.linear_weight(host[mlp + "gate_proj.weight"]),
            up=backend.linear_weight(host[mlp + "up_proj.weight"]),
            down=backend.linear_weight(host[mlp + "down_proj.weight"]),
            pre_feedforward_norm=backend.from_numpy(host[prefix + "pre_feedforward_layernorm.weight"]),
            post_feedforward_norm=backend.from_numpy(host[prefix + "post_feedforward_layernorm.weight"]),
            cos=cos,
            sin=sin,
        )

    # --- forward ------------------------------------------------------------------------------
    def layer_forward(
        self,
        layer: LlamaLayerWeights,
        hidden: Any,
        residual: Any | None,
        positions: Any,
        cos: Any,
        sin: Any,
        batch: Any,
        kv_cache: Any,
    ) -> tuple[Any, Any]:
        """(the layer's output, the residual stream before it is added), like Llama's; the
        layer's own rotary tables replace `cos`/`sin`."""
        ops, eps, block = self.backend, self.config.rms_norm_eps, layer.mlp
        attention, residual = ops.attention_block(
            hidden, residual, layer.attention, positions, block.cos, block.sin, batch, kv_cache
        )
        attention, _ = ops.rms_norm(attention, layer.post_norm, eps)
        normed, residual = ops.rms_norm(attention, block.pre_feedforward_norm, eps, residual)
        gated = ops.gelu_tanh(ops.linear(normed, block.gate)) * ops.linear(normed, block.up)
        out, _ = ops.rms_norm(ops.linear(gated, block.down), block.post_feedforward_norm, eps)
        return out, residual

    def forward(self, input_ids: Any, positions: Any, batch: Any, kv_caches: list[Any]) -> Any:
        ops = self.backend
        # transformers scales in the weights' dtype: sqrt(hidden) rounded to float32
        scale = float(np.float32(math.sqrt(self.config.hidden_size)))
        hidden = self.parallel.vocab_embedding(ops, input_ids, self.embed_tokens) * scale
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            window_batch = layer_batch(batch, layer.attention.window)  # its KV group's tables
            hidden, residual = self.layer_forward(
                layer, hidden, residual, positions, None, None, window_batch, kv_cache
            )
        normed, _ = ops.rms_norm(hidden, self.final_norm, self.config.rms_norm_eps, residual)
        return normed

    def compute_logits(self, hidden: Any) -> Any:
        logits = super().compute_logits(hidden)
        return self.backend.softcap(logits, self.final_softcap) if self.final_softcap else logits
