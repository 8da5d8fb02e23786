"""Sparse mixture-of-experts decoders: Mixtral, Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B) and
Qwen3-MoE, registered as a built-in plugin, which also registers DeepSeek-V3 (`deepseek_v3.py`),
GLM-4.5 (`glm4_moe.py`) and GPT-OSS (`gpt_oss.py`).

Each is its dense sibling (Llama, Qwen2, Qwen3) with the feed-forward block of some layers
replaced by `top_k`-of-`num_experts` routed SwiGLU experts:

- the router is a softmax over the experts of `gate(x)`; the top_k probabilities weight the
  chosen experts, renormalised to sum 1 when `norm_topk_prob` (always for Mixtral);
- Qwen2-MoE adds a shared expert (a SwiGLU MLP of `shared_expert_intermediate_size`) whose
  output is scaled per token by sigmoid(`shared_expert_gate`(x)) and added;
- Qwen2/Qwen3-MoE layers listed in `mlp_only_layers`, or not on the `decoder_sparse_step`
  stride, keep a dense MLP of `intermediate_size`.

Tensor names are the Hugging Face checkpoints' (Mixtral's `block_sparse_moe.experts.N.w1/w3/w2`
for gate/up/down, the Qwen models' `mlp.experts.N.gate_proj/up_proj/down_proj`). Split over
tensor-parallel ranks the routed experts are divided among the ranks (expert parallel) and the
shared expert is split like a dense MLP, as for ERNIE-4.5's MoE; the routing and expert ops are
the backend's `moe_route` / `moe_experts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.deepseek_v3 import DeepseekV3ForCausalLM
from fastdeploy.models.glm4_moe import Glm4MoeForCausalLM
from fastdeploy.models.gpt_oss import GptOssForCausalLM
from fastdeploy.models.llama import (
    DenseMLPWeights,
    LlamaForCausalLM,
    LlamaLayerWeights,
    ProjectionBiases,
    required_field,
)
from fastdeploy.models.qwen import Qwen2ForCausalLM, Qwen3ForCausalLM
from fastdeploy.plugins.api import (
    Backend,
    InvalidArgumentError,
    ModelConfig,
    ModelParallel,
    hookimpl,
)


@dataclass
class SparseMoEWeights:
    """One sparse MoE block: router, this rank's routed experts, optional gated shared expert."""

    gate: Any
    experts: Any
    shared: DenseMLPWeights | None = None
    #: [1, hidden] weight of the shared expert's sigmoid gate (Qwen2-MoE)
    shared_gate: Any | None = None


class SparseMoEMixin:
    """The routed-expert feed-forward block; mixed into a Llama-family class before it.

    Subclasses set where the block's tensors live (`moe_prefix`, `expert_parts`) and read their
    config.json fields in `moe_config`.
    """

    #: the block's name inside a layer ("mlp." or Mixtral's "block_sparse_moe.")
    moe_prefix = "mlp."
    #: an expert's gate, up and down projection names
    expert_parts = ("gate_proj", "up_proj", "down_proj")
    #: the shared expert's name inside the block, when the architecture has one
    shared_prefix: str | None = None

    config: ModelConfig
    parallel: ModelParallel
    backend: Backend

    def moe_config(self) -> None:
        """Read the expert fields of config.json (called once from `__init__`); transformers 5
        saves Qwen-MoE's `num_experts` as `num_local_experts`."""
        self.num_experts = int(required_field(self.config, "num_experts", "num_local_experts"))
        self.top_k = int(required_field(self.config, "num_experts_per_tok"))
        self.norm_topk_prob = bool(self.config.raw.get("norm_topk_prob", False))
        raw = self.config.raw
        step = int(raw.get("decoder_sparse_step", 1) or 1)
        dense = set(raw.get("mlp_only_layers") or ())
        self.moe_layers = frozenset(
            i for i in range(self.config.num_hidden_layers) if i not in dense and (i + 1) % step == 0
        )

    def init_moe(self) -> None:
        self.moe_config()
        if not 0 < self.top_k <= self.num_experts:
            raise InvalidArgumentError(
                f"config.json: num_experts_per_tok must be between 1 and the {self.num_experts} experts, "
                f"got {self.top_k}"
            )
        #: the routed experts this rank computes (expert parallel over the tensor-parallel group)
        self.local_experts = self.parallel.shard_of(self.num_experts)

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        if layer not in self.moe_layers:
            return super().mlp_names(layer, prefix)
        block = prefix + self.moe_prefix
        names = {block + "gate.weight"}
        for expert in range(self.num_experts):
            names.update(f"{block}experts.{expert}.{part}.weight" for part in self.expert_parts)
        if self.shared_prefix is not None:
            names.update(self.dense_mlp_names(block + self.shared_prefix))
            names.add(block + "shared_expert_gate.weight")
        return names

    def load_mlp(self, layer: int, prefix: str, host: dict[str, Any]) -> Any:
        if layer not in self.moe_layers:
            return super().load_mlp(layer, prefix, host)
        backend = self.backend
        block = prefix + self.moe_prefix
        experts = [f"{block}experts.{expert}." for expert in self.local_experts]
        gate, up, down = self.expert_parts
        weights = SparseMoEWeights(
            gate=backend.linear_weight(host[block + "gate.weight"]),
            experts=backend.moe_expert_weights(
                [host[p + f"{gate}.weight"] for p in experts],
                [host[p + f"{up}.weight"] for p in experts],
                [host[p + f"{down}.weight"] for p in experts],
            ),
        )
        if self.shared_prefix is not None:
            weights.shared = self.load_dense_mlp(block + self.shared_prefix, host)
            weights.shared_gate = np.asarray(host[block + "shared_expert_gate.weight"], dtype=np.float32)
        return weights

    def mlp_block(self, layer: LlamaLayerWeights, x: Any) -> Any:
        moe = layer.mlp
        if not isinstance(moe, SparseMoEWeights):
            return super().mlp_block(layer, x)
        ops = self.backend
        weights, ids = ops.moe_route(
            ops.linear(x, moe.gate), self.top_k, None, renormalize=self.norm_topk_prob
        )
        if len(self.local_experts) == self.num_experts:
            out = ops.moe_experts(x, moe.experts, weights, ids)
        else:
            out = ops.moe_experts(x, moe.experts, weights, ids, first_expert=self.local_experts.start)
        if moe.shared is not None:
            out = out + self.dense_mlp(moe.shared, x) * self._shared_gate(moe.shared_gate, x)
        return out

    def _shared_gate(self, weight: np.ndarray, x: Any) -> Any:
        """sigmoid(x @ weight.T), [tokens, 1], computed on the host (the backend contract has no
        sigmoid op; the shared gate is one dot product per token)."""
        ops = self.backend
        logits = np.asarray(ops.to_numpy(x), dtype=np.float32) @ weight.T
        return ops.from_numpy((0.5 * (1.0 + np.tanh(0.5 * logits))).astype(np.float32))


class MixtralForCausalLM(SparseMoEMixin, LlamaForCausalLM):
    """Mixtral: every layer's MLP is `num_experts_per_tok`-of-`num_local_experts` experts,
    weights always renormalised."""

    moe_prefix = "block_sparse_moe."
    expert_parts = ("w1", "w3", "w2")

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        super().__init__(config, backend, max_positions, parallel)
        self.init_moe()

    def projection_biases(self) -> ProjectionBiases:
        return ProjectionBiases()

    def moe_config(self) -> None:
        self.num_experts = int(required_field(self.config, "num_local_experts"))
        self.top_k = int(required_field(self.config, "num_experts_per_tok"))
        self.norm_topk_prob = True
        self.moe_layers = frozenset(range(self.config.num_hidden_layers))


class Qwen2MoeForCausalLM(SparseMoEMixin, Qwen2ForCausalLM):
    """Qwen2-MoE: q/k/v biases (`qkv_bias`, default on), routed experts plus a gated shared expert.
    The shared gate runs on the host, so decode steps are not captured in device graphs."""

    shared_prefix = "shared_expert."
    supports_decode_graphs = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.init_moe()

    def projection_biases(self) -> ProjectionBiases:
        return ProjectionBiases(qkv=bool(self.config.raw.get("qkv_bias", True)))

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        if layer in self.moe_layers:
            required_field(self.config, "shared_expert_intermediate_size")
        return super().mlp_names(layer, prefix)


class Qwen3MoeForCausalLM(SparseMoEMixin, Qwen3ForCausalLM):
    """Qwen3-MoE: per-head q/k RMSNorm, routed experts without a shared one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.init_moe()


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return {
        "GptOssForCausalLM": GptOssForCausalLM,
        "MixtralForCausalLM": MixtralForCausalLM,
        "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
        "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
        "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
        "Glm4MoeForCausalLM": Glm4MoeForCausalLM,
    }
