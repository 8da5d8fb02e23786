"""Grouped-routed mixture of experts, as DeepSeek-V3 and GLM-4.5 route: the feed-forward half that
both share (their attention differs: latent in DeepSeek-V3, grouped-query in GLM-4.5).

The first `first_k_dense_replace` layers are dense SwiGLU MLPs; the others route each token to
`num_experts_per_tok` of `n_routed_experts` experts and add `n_shared_experts` shared ones (one
MLP of n_shared x `moe_intermediate_size`). Routing: sigmoid scores of the gate;
`e_score_correction_bias` is added for choosing only; the experts are split in `n_group`
groups, each group scored by the sum of its two best biased scores, and only the `topk_group`
best groups compete; the chosen experts' unbiased scores, renormalised when `norm_topk_prob`,
times `routed_scaling_factor`, weight them. The routing runs on the host (the backend's
`moe_route` is softmax routing); the experts are the backend's `moe_experts`. Split over
tensor-parallel ranks, a rank holds its share of the routed experts (expert parallel) and of the
dense and shared MLPs' features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.llama import DenseMLPWeights, required_field
from fastdeploy.plugins.api import ModelConfig, UnsupportedModelError


@dataclass
class RoutedMoEWeights:
    """One MoE layer: gate (host float32), correction bias, this rank's routed experts, shared MLP."""

    gate: np.ndarray
    correction_bias: np.ndarray
    experts: Any
    shared: DenseMLPWeights | None


def grouped_topk(
    logits: np.ndarray,
    correction_bias: np.ndarray,
    top_k: int,
    num_groups: int,
    top_groups: int,
    normalize: bool,
    scaling: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The grouped routing of router logits [tokens, experts]: (weights float32, expert ids
    int64), each [tokens, top_k] (see the module doc)."""
    scores = (1.0 / (1.0 + np.exp(-logits.astype(np.float32)))).astype(np.float32)
    choice = scores + correction_bias[None, :]
    tokens, experts = choice.shape
    per_group = experts // num_groups
    grouped = np.sort(choice.reshape(tokens, num_groups, per_group), axis=-1)
    group_scores = grouped[..., -min(2, per_group) :].sum(axis=-1)
    best_groups = np.argsort(-group_scores, axis=-1, kind="stable")[:, :top_groups]
    allowed = np.zeros((tokens, num_groups), dtype=bool)
    allowed[np.arange(tokens)[:, None], best_groups] = True
    choice = np.where(np.repeat(allowed, per_group, axis=1), choice, -np.inf)
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(scores, ids, axis=1)
    if normalize:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + np.float32(1e-20))
    return (weights * np.float32(scaling)).astype(np.float32), ids.astype(np.int64)


class GroupedMoEMixin:
    """The feed-forward half of a `LlamaForCausalLM` subclass as grouped-routed experts: call
    `read_moe_config` before the Llama constructor and `init_moe` after it."""

    #: the host routing reads device values: no captured decode graphs
    supports_decode_graphs = False

    def read_moe_config(self, config: ModelConfig) -> None:
        """The routing fields of config.json (each named when missing)."""
        raw = config.raw
        self.num_experts = int(required_field(config, "n_routed_experts", "num_local_experts"))
        self.top_k = int(required_field(config, "num_experts_per_tok"))
        self.moe_intermediate = int(required_field(config, "moe_intermediate_size"))
        self.num_groups = int(required_field(config, "n_group"))
        self.top_groups = int(required_field(config, "topk_group"))
        self.routed_scaling = float(required_field(config, "routed_scaling_factor"))
        self.first_moe_layer = int(required_field(config, "first_k_dense_replace"))
        self.num_shared = int(raw.get("n_shared_experts", 1) or 0)
        self.norm_topk_prob = bool(raw.get("norm_topk_prob", True))
        if self.num_experts % self.num_groups or not 0 < self.top_groups <= self.num_groups:
            raise UnsupportedModelError(
                f"config.json: n_routed_experts ({self.num_experts}) must split into n_group "
                f"({self.num_groups}) equal groups, and topk_group ({self.top_groups}) be 1..n_group"
            )

    def init_moe(self) -> None:
        """Which layers route, and this rank's experts (after the Llama constructor)."""
        self.moe_layers = frozenset(range(self.first_moe_layer, self.config.num_hidden_layers))
        self.local_experts = self.parallel.shard_of(self.num_experts)

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        return set(self.mlp_shapes(layer, prefix))

    def mlp_shapes(self, layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
        """[out, in] shapes of layer `layer`'s feed-forward tensors."""
        hidden, mlp = self.config.hidden_size, prefix + "mlp."

        def swiglu(block: str, inner: int) -> dict[str, tuple[int, ...]]:
            return {
                block + "gate_proj.weight": (inner, hidden),
                block + "up_proj.weight": (inner, hidden),
                block + "down_proj.weight": (hidden, inner),
            }

        if layer not in self.moe_layers:
            return swiglu(mlp, self.config.intermediate_size)
        shapes = {mlp + "gate.weight": (self.num_experts, hidden)}
        shapes[mlp + "gate.e_score_correction_bias"] = (self.num_experts,)
        for expert in range(self.num_experts):
            shapes.update(swiglu(f"{mlp}experts.{expert}.", self.moe_intermediate))
        if self.num_shared:
            shapes.update(swiglu(mlp + "shared_experts.", self.moe_intermediate * self.num_shared))
        return shapes

    def load_mlp(self, layer: int, prefix: str, host: dict[str, Any]) -> Any:
        if layer not in self.moe_layers:
            return super().load_mlp(layer, prefix, host)  # type: ignore[misc]
        mlp = prefix + "mlp."
        experts = [f"{mlp}experts.{expert}." for expert in self.local_experts]
        return RoutedMoEWeights(
            gate=np.asarray(host[mlp + "gate.weight"], dtype=np.float32),
            correction_bias=np.asarray(host[mlp + "gate.e_score_correction_bias"], dtype=np.float32),
            experts=self.backend.moe_expert_weights(
                [host[p + "gate_proj.weight"] for p in experts],
                [host[p + "up_proj.weight"] for p in experts],
                [host[p + "down_proj.weight"] for p in experts],
            ),
            shared=self.load_dense_mlp(mlp + "shared_experts.", host) if self.num_shared else None,
        )

    def mlp_block(self, layer: Any, x: Any) -> Any:
        moe = layer.mlp
        if not isinstance(moe, RoutedMoEWeights):
            return self.dense_mlp(moe, x)
        ops = self.backend
        host = np.asarray(ops.to_numpy(x), dtype=np.float32)
        weights, ids = grouped_topk(
            host @ moe.gate.T,
            moe.correction_bias,
            self.top_k,
            self.num_groups,
            self.top_groups,
            self.norm_topk_prob,
            self.routed_scaling,
        )
        first = self.local_experts.start
        out = ops.moe_experts(
            x, moe.experts, ops.from_numpy(weights), ops.from_numpy(ids), first_expert=first
        )
        if moe.shared is not None:
            out = out + self.dense_mlp(moe.shared, x)
        return out
