"""ERNIE-4.5 text models: dense (`Ernie4_5ForCausalLM`, e.g. 0.3B) and MoE (`Ernie4_5_MoeForCausalLM`,
e.g. 21B-A3B), registered as a built-in plugin.

Both are Llama-shaped (RMSNorm, GQA, SwiGLU) with three differences, checked against
transformers' implementations by tests/models:

- Rotary embedding pairs adjacent dimensions (2i, 2i+1) of each head instead of the two halves.
  q.k is unchanged by permuting the dimensions of every query and key head the same way, so the
  q/k projection rows are permuted once at load time (interleaved -> halves, head by head, so a
  tensor-parallel rank permutes only its heads) and the backend's rotate-half rotary applies.
  V and the attention output are untouched.
- `use_bias` puts biases on every projection (and on the MoE model's lm_head).
- MoE layers (from `moe_layer_start_index`, every `moe_layer_interval`, up to
  `moe_layer_end_index`) replace the MLP by `moe_k`-of-`moe_num_experts` routed SwiGLU experts
  plus `moe_num_shared_experts` shared ones (one MLP of `moe_num_shared_experts` x
  `moe_intermediate_size`). The router is a softmax over experts; `e_score_correction_bias` is
  added to the probabilities to choose the experts but not to weight them. Split over
  tensor-parallel ranks, the routed experts are divided among the ranks (expert parallel: each
  computes its experts' share for all tokens), the shared experts are split like a dense MLP,
  and one all-reduce sums both.

Paddle checkpoints (`ernie.` prefix, fused projections, [in, out] layout) reach this class
already translated to these names by `model_executor.loaders.paddle_ernie`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastdeploy.models.llama import DenseMLPWeights, LlamaForCausalLM, LlamaLayerWeights, ProjectionBiases
from fastdeploy.plugins.api import ModelConfig, hookimpl, interleaved_to_half_rows


def use_bias_projections(config: ModelConfig) -> ProjectionBiases:
    """ERNIE-4.5's `use_bias`: a bias on every projection of a decoder layer, or on none (also
    PaddleOCR-VL's ERNIE-4.5-0.3B-shaped language model)."""
    bias = bool(config.raw.get("use_bias", False))
    return ProjectionBiases(qkv=bias, o_proj=bias, mlp=bias)


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    """ERNIE-4.5 dense decoder."""

    default_rope_theta = 500000.0
    #: multi-token-prediction heads of some checkpoints, which transformers ignores too
    ignored_prefixes = ("model.mtp_", "mtp_", "mtp.")

    def projection_biases(self) -> ProjectionBiases:
        return use_bias_projections(self.config)

    def qk_head_rows(self, tensor: Any, heads: range) -> Any:
        # the reordering is within each head, so it applies to a rank's heads alone
        return interleaved_to_half_rows(super().qk_head_rows(tensor, heads), len(heads))


@dataclass
class MoEWeights:
    """One MoE layer: router, its correction bias, routed experts, and the shared experts."""

    gate: Any
    correction_bias: Any
    experts: Any
    shared: DenseMLPWeights | None


class Ernie4_5_MoeForCausalLM(Ernie4_5ForCausalLM):
    """ERNIE-4.5 MoE decoder (21B-A3B, 300B-A47B text models)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        raw = self.config.raw
        layers = self.config.num_hidden_layers
        self.num_experts = int(raw["moe_num_experts"])
        self.top_k = int(raw.get("moe_k", 6))
        self.num_shared = int(raw.get("moe_num_shared_experts", 0) or 0)
        self.norm_min = float(raw.get("moe_norm_min", 1e-12))
        start = raw.get("moe_layer_start_index", 1)
        end = raw.get("moe_layer_end_index", -1)
        # multimodal checkpoints give [text, vision] pairs; the text experts come first
        start = int(start[0] if isinstance(start, list) else start)
        end = int(end[0] if isinstance(end, list) else end)
        end = layers - 1 if end == -1 else end
        interval = int(raw.get("moe_layer_interval", 1) or 1)
        self.moe_layers = frozenset(i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end)
        #: the routed experts this rank computes (expert parallel over the tensor-parallel group)
        self.local_experts = self.parallel.shard_of(self.num_experts)

    def has_lm_head_bias(self) -> bool:
        return bool(self.config.raw.get("use_bias", False))

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        if layer not in self.moe_layers:
            return super().mlp_names(layer, prefix)
        mlp = prefix + "mlp."
        names = {mlp + "gate.weight", mlp + "moe_statics.e_score_correction_bias"}
        # routed experts have no biases even with use_bias (as in transformers)
        for expert in range(self.num_experts):
            names.update(f"{mlp}experts.{expert}.{part}_proj.weight" for part in ("gate", "up", "down"))
        if self.num_shared:
            names.update(self.dense_mlp_names(mlp + "shared_experts."))
        return names

    def load_mlp(self, layer: int, prefix: str, host: dict[str, Any]) -> Any:
        if layer not in self.moe_layers:
            return super().load_mlp(layer, prefix, host)
        backend = self.backend
        mlp = prefix + "mlp."
        experts = [f"{mlp}experts.{expert}." for expert in self.local_experts]
        return MoEWeights(
            gate=backend.linear_weight(host[mlp + "gate.weight"]),
            correction_bias=backend.from_numpy(host[mlp + "moe_statics.e_score_correction_bias"].reshape(-1)),
            experts=backend.moe_expert_weights(
                [host[p + "gate_proj.weight"] for p in experts],
                [host[p + "up_proj.weight"] for p in experts],
                [host[p + "down_proj.weight"] for p in experts],
            ),
            shared=self.load_dense_mlp(mlp + "shared_experts.", host) if self.num_shared else None,
        )

    def mlp_block(self, layer: LlamaLayerWeights, x: Any) -> Any:
        moe = layer.mlp
        if not isinstance(moe, MoEWeights):
            return self.dense_mlp(moe, x)
        ops = self.backend
        weights, ids = ops.moe_route(
            ops.linear(x, moe.gate), self.top_k, moe.correction_bias, renormalize=True, norm_min=self.norm_min
        )
        if len(self.local_experts) == self.num_experts:
            out = ops.moe_experts(x, moe.experts, weights, ids)
        else:
            out = ops.moe_experts(x, moe.experts, weights, ids, first_expert=self.local_experts.start)
        if moe.shared is not None:
            out = out + self.dense_mlp(moe.shared, x)
        return out


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    # "Ernie4_5_ForCausalLM" is the name in the -Paddle checkpoints' config.json.
    return {
        "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
        "Ernie4_5_ForCausalLM": Ernie4_5ForCausalLM,
        "Ernie4_5_MoeForCausalLM": Ernie4_5_MoeForCausalLM,
    }
