"""Phi-3, Phi-3.5 and Phi-4 text models (`Phi3ForCausalLM`), registered as a built-in plugin.

A Llama-shaped decoder (RMSNorm, grouped-query attention, SwiGLU, no biases) whose checkpoints
fuse the q/k/v projections into `self_attn.qkv_proj` ([q | k | v] rows) and the gate/up
projections into `mlp.gate_up_proj` ([gate | up] rows). They are split at load time into the
names the Llama class loads (which fuses them again, per tensor-parallel shard).

Rotary embedding may cover only the first `partial_rotary_factor` of each head (Phi-4-mini) and
may use LongRoPE (`rope_scaling` of type "longrope", formerly "su": per-frequency `short_factor`
/ `long_factor` divisors and an attention factor derived from the context extension ratio,
`max_position_embeddings / original_max_position_embeddings`). Phi-4 uses plain rotary.
"""

from __future__ import annotations

from typing import Any

from fastdeploy.models.llama import LlamaForCausalLM, partial_rotary_dim
from fastdeploy.plugins.api import (
    InvalidArgumentError,
    WeightLoadError,
    hookimpl,
    rope_tables,
    take_rows,
)


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 / Phi-3.5 / Phi-4: fused projections, partial rotary, LongRoPE."""

    def rope_parameters(self) -> dict[str, Any]:
        """`rope_scaling` (or transformers 5's `rope_parameters`) merged with the top-level fields
        Phi-3's config.json keeps beside it."""
        raw = self.config.raw
        parameters = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
        merged = dict(parameters) | dict(self.config.rope_scaling or {})
        for name in ("partial_rotary_factor", "original_max_position_embeddings"):
            if name not in merged and raw.get(name) is not None:
                merged[name] = raw[name]
        return merged

    def rotary_tables(self, freq_factors: Any | None) -> tuple[Any, Any]:
        parameters = self.rope_parameters()
        rotary_dim = partial_rotary_dim(self.head_dim, float(parameters.get("partial_rotary_factor", 1.0)))
        kind = parameters.get("rope_type") or parameters.get("type") or "default"
        scaling = None
        if kind != "default":
            scaling = dict(parameters)
            if kind in ("longrope", "su"):
                if scaling.get("original_max_position_embeddings") is None:
                    raise InvalidArgumentError(
                        "config.json lacks the field 'original_max_position_embeddings' that LongRoPE "
                        "rope_scaling needs"
                    )
                if scaling.get("factor") is None:
                    scaling["factor"] = (
                        self.config.max_position_embeddings / scaling["original_max_position_embeddings"]
                    )
        return rope_tables(self.rope_theta(), rotary_dim, self.max_positions, scaling, freq_factors)

    def preprocess_weights(self, host: dict[str, Any]) -> None:
        config = self.config
        q_rows = config.num_attention_heads * config.head_dim
        kv_rows = config.num_key_value_heads * config.head_dim
        for i in range(config.num_hidden_layers):
            attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            qkv = host.pop(attn + "qkv_proj.weight", None)
            if qkv is not None:
                _check_rows(attn + "qkv_proj.weight", qkv, q_rows + 2 * kv_rows)
                host[attn + "q_proj.weight"] = take_rows(qkv, range(0, q_rows))
                host[attn + "k_proj.weight"] = take_rows(qkv, range(q_rows, q_rows + kv_rows))
                host[attn + "v_proj.weight"] = take_rows(qkv, range(q_rows + kv_rows, q_rows + 2 * kv_rows))
            gate_up = host.pop(mlp + "gate_up_proj.weight", None)
            if gate_up is not None:
                _check_rows(mlp + "gate_up_proj.weight", gate_up, 2 * config.intermediate_size)
                inner = config.intermediate_size
                host[mlp + "gate_proj.weight"] = take_rows(gate_up, range(0, inner))
                host[mlp + "up_proj.weight"] = take_rows(gate_up, range(inner, 2 * inner))


def _check_rows(name: str, tensor: Any, rows: int) -> None:
    if tensor.shape[0] != rows:
        raise WeightLoadError(
            f"checkpoint does not match its config.json: {name} has {tensor.shape[0]} rows, "
            f"config.json implies {rows}"
        )


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return {"Phi3ForCausalLM": Phi3ForCausalLM}
