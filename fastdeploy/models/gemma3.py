"""Gemma 3 text models (`Gemma3ForCausalLM`: Gemma 3 1B and the text towers' checkpoints),
registered as a built-in plugin.

A decoder with grouped-query attention like Llama's, differing in what the Llama class's
override points cannot express, so the layer and the forward pass are its own:

- RMSNorm weights are stored as offsets: the scale is (1 + w) (added once at load);
- four norms per layer: input, post-attention (on the attention output, before the residual
  add), pre-feed-forward and post-feed-forward; per-head q/k RMSNorm before rotary;
- the MLP is GELU(tanh)(gate) * up;
- the embedding is scaled by sqrt(hidden_size); attention scores by `query_pre_attn_scalar`^-0.5;
  `head_dim` need not be hidden / heads;
- layers alternate sliding-window ("sliding_attention", rotary base `rope_local_base_freq`) and
  global ("full_attention", base `rope_theta` with `rope_scaling`) attention, by `layer_types`
  or every `sliding_window_pattern`-th layer global.

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
    ModelConfig,
    ModelParallel,
    hookimpl,
    layer_batch,
    rope_tables,
)

GLOBAL = "full_attention"


@dataclass
class Gemma3Block:
    """A layer's parts beyond Llama's: the GELU MLP, its two norms, the layer's rotary tables."""

    gate: Any
    up: Any
    down: Any
    pre_feedforward_norm: Any
    post_feedforward_norm: Any
    cos: Any
    sin: Any


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 text decoder."""

    supports_parallel = False

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        self.layer_types: list[str] = []
        super().__init__(config, backend, max_positions, parallel)
        raw = config.raw
        self.scale = float(raw.get("query_pre_attn_scalar") or config.head_dim) ** -0.5
        self.layer_types = sliding_layer_types(
            self.config, GLOBAL, int(self.config.raw.get("sliding_window_pattern", 6) or 6)
        )
        self.tables: dict[str, tuple[Any, Any]] = {}

    def attention_window(self, layer: int) -> int:
        return self.window if self.layer_types[layer] == SLIDING else 0

    def projection_biases(self) -> ProjectionBiases:
        attention = bool(self.config.raw.get("attention_bias", False))
        return ProjectionBiases(qkv=attention, o_proj=attention)

    def has_qk_norm(self) -> bool:
        return True

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        return super().mlp_names(layer, prefix) | {
            prefix + "pre_feedforward_layernorm.weight",
            prefix + "post_feedforward_layernorm.weight",
        }

    def preprocess_weights(self, host: dict[str, Any]) -> None:
        for name in [n for n in host if n.endswith("norm.weight")]:
            host[name] = np.asarray(host[name], dtype=np.float32) + np.float32(1.0)

    def _rope(self, kind: str) -> tuple[Any, Any]:
        """Host (cos, sin) of the sliding or global layers (transformers 5's per-type
        `rope_parameters`, or the Hub's rope_theta / rope_local_base_freq / rope_scaling)."""
        raw = self.config.raw
        parameters = raw.get("rope_parameters")
        if isinstance(parameters, dict) and kind in parameters:
            scaling = dict(parameters[kind])
            base = float(scaling.pop("rope_theta"))
        elif kind == SLIDING:
            base, scaling = float(raw.get("rope_local_base_freq", 10000.0)), None
        else:
            base, scaling = float(raw.get("rope_theta", 1000000.0)), self.config.rope_scaling
        return rope_tables(base, self.head_dim, self.max_positions, scaling)

    def rotary_tables(self, freq_factors: Any | None) -> tuple[Any, Any]:
        return self._rope(GLOBAL)

    def load_mlp(self, layer: int, prefix: str, host: dict[str, Any]) -> Gemma3Block:
        backend = self.backend
        kind = self.layer_types[layer]
        if kind not in self.tables:
            cos, sin = self._rope(kind)
            self.tables[kind] = (backend.from_numpy(cos), backend.from_numpy(sin))
        cos, sin = self.tables[kind]
        mlp = prefix + "mlp."
        return Gemma3Block(
            gate=backend.linear_weight(host[mlp + "gate_proj.weight"]),
            up=backend.linear_weight(host[mlp + "up_proj.weight"]),
            down=backend.linear_weight(host[mlp + "down_proj.weight"]),
            pre_feedforward_norm=backend.from_numpy(host[prefix + "pre_feedforward_layernorm.weight"]),
            post_feedforward_norm=backend.from_numpy(host[prefix + "post_feedforward_layernorm.weight"]),
            cos=cos,
            sin=sin,
        )

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
            hidden, residual = self.layer_forward(
                layer,
                hidden,
                residual,
                positions,
                None,
                None,
                layer_batch(batch, layer.attention.window),
                kv_cache,
            )
        normed, _ = ops.rms_norm(hidden, self.final_norm, self.config.rms_norm_eps, residual)
        return normed


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return {"Gemma3ForCausalLM": Gemma3ForCausalLM}
