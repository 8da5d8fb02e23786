"""GLM-4.5 and GLM-4.5-Air (`Glm4MoeForCausalLM`), registered through the sparse-MoE plugin module.

Attention is Llama's grouped-query attention with three differences:

- q/k/v projections carry biases when `attention_bias` (o_proj never does);
- with `use_qk_norm`, each query and key head is RMS-normalised before rotary, as in Qwen3;
- rotary embedding covers only the first `partial_rotary_factor` of each head (0.5 when
  config.json does not say), in the rotate-half layout.

The feed-forward half is DeepSeek-V3's: dense SwiGLU for the first `first_k_dense_replace` layers,
then grouped-routed experts with sigmoid scores, the score-correction bias, the routed scaling
factor and shared experts (`grouped_moe.py`). The checkpoint's multi-token-prediction layers
(`num_nextn_predict_layers`, stored after the decoder's) are not used.
"""

from __future__ import annotations

from typing import Any

from fastdeploy.models.grouped_moe import GroupedMoEMixin
from fastdeploy.models.llama import LlamaForCausalLM, ProjectionBiases, partial_rotary_dim
from fastdeploy.plugins.api import Backend, ModelConfig, ModelParallel, rope_tables

#: transformers' Glm4MoeConfig default when config.json names no partial_rotary_factor
DEFAULT_PARTIAL_ROTARY = 0.5


class Glm4MoeForCausalLM(GroupedMoEMixin, LlamaForCausalLM):
    """GLM-4.5 decoder: see the module doc."""

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        self.read_moe_config(config)
        super().__init__(config, backend, max_positions, parallel)
        self.init_moe()
        mtp_layers = int(config.raw.get("num_nextn_predict_layers") or 0)
        self.ignored_prefixes = tuple(
            f"model.layers.{config.num_hidden_layers + i}." for i in range(mtp_layers)
        )

    def projection_biases(self) -> ProjectionBiases:
        return ProjectionBiases(qkv=bool(self.config.raw.get("attention_bias", False)))

    def has_qk_norm(self) -> bool:
        return bool(self.config.raw.get("use_qk_norm", False))

    def rotary_tables(self, freq_factors: Any | None) -> tuple[Any, Any]:
        raw = self.config.raw
        parameters = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
        factor = parameters.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
        rotary_dim = partial_rotary_dim(
            self.head_dim, float(DEFAULT_PARTIAL_ROTARY if factor is None else factor)
        )
        return rope_tables(
            self.rope_theta(), rotary_dim, self.max_positions, self.config.rope_scaling, freq_factors
        )

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = super()._expected_shapes()
        for i in range(self.config.num_hidden_layers):
            shapes.update(self.mlp_shapes(i, f"model.layers.{i}."))
        return shapes
