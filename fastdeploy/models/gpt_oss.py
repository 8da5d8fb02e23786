"""GPT-OSS (`GptOssForCausalLM`: gpt-oss-20b / gpt-oss-120b), registered as a built-in plugin
(through `sparse_moe`'s hook).

A Llama-shaped decoder (RMSNorm, grouped-query attention, rotate-half rotary) with:

- attention sinks: a learned logit per query head (`self_attn.sinks`) in every softmax
  denominator (`AttentionBlock.sinks`, run by `Backend.attention_with_sinks`,
  `Capability.ATTENTION_SINKS`); biases on q/k/v/o;
- YaRN rotary (`rope_parameters`, rope_theta 150000 by default);
- layers alternating sliding-window and full attention (`layer_types`): past `sliding_window`
  the sliding layers attend over their window only (`AttentionBlock.window`, on a backend that
  also declares `Capability.SLIDING_WINDOW`; elsewhere such contexts are refused);
- every feed-forward block a mixture of experts: the router is a linear layer with a bias whose
  top-k logits are softmaxed into the chosen experts' weights; an expert is a clamped SwiGLU
  with biases, `(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)` where
  g = min(gate, limit) (alpha 1.702, `swiglu_limit` 7.0), gate and up interleaved in the
  checkpoint's `gate_up_proj` columns;
- expert weights either float (`mlp.experts.gate_up_proj` [experts, hidden, 2 * inner],
  `down_proj` [experts, inner, hidden], as transformers saves them) or MXFP4 as released
  (`gate_up_proj_blocks` / `_scales`, `down_proj_blocks` / `_scales`), kept packed
  (`fastdeploy.formats.mxfp4`): the cpu backend multiplies the blocks themselves.

The attention half is Llama's (`Backend.attention_block`); the experts run as the backend's
linear ops per chosen expert, with the routing and the clamped activation on the host (the fused
MoE op has no expert biases or clamp), so decode steps are not captured in device graphs.

Split over tensor-parallel ranks, attention is split by heads as Llama's (q/k/v rows and their
biases, o_proj columns, each rank's query heads' sinks; o_proj's bias added by rank 0 only) and
the experts by expert, as the other sparse-MoE families: every rank routes every token, and
computes, packed MXFP4 blocks included, only the chosen experts it holds; the partial outputs
are summed over the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.attention_window import sliding_layer_types
from fastdeploy.models.llama import LlamaForCausalLM, LlamaLayerWeights, ProjectionBiases
from fastdeploy.plugins.api import (
    Backend,
    Capability,
    InvalidArgumentError,
    ModelConfig,
    ModelParallel,
    UnsupportedModelError,
    mxfp4_experts_to_ggml,
    rope_tables,
)

FULL = "full_attention"
SWIGLU_ALPHA = 1.702
DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
EXPERT_PARTS = ("gate_up_proj", "down_proj")


@dataclass
class GptOssBlock:
    """A layer's mixture of experts: the router, and this rank's experts."""

    router: Any
    router_bias: Any
    #: per expert of `GptOssForCausalLM.local_experts`: (gate/up weight with the gate rows first,
    #: its bias, down weight, its bias)
    experts: list[tuple[Any, Any, Any, Any]]


def _required(config: ModelConfig, name: str) -> Any:
    value = config.raw.get(name)
    if value is None:
        raise InvalidArgumentError(f"config.json of {config.architecture} lacks the required field {name!r}")
    return value


class GptOssForCausalLM(LlamaForCausalLM):
    """GPT-OSS decoder (see the module docstring)."""

    supports_decode_graphs = False

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        max_positions: int,
        parallel: ModelParallel | None = None,
    ) -> None:
        if not backend.supports(Capability.ATTENTION_SINKS):
            raise UnsupportedModelError(
                f"{config.architecture} needs attention sinks, which the {backend.name} backend lacks "
                "(Capability.ATTENTION_SINKS); use device='cpu'"
            )
        super().__init__(config, backend, max_positions, parallel)
        self.num_experts = int(_required(config, "num_local_experts"))
        self.top_k = int(_required(config, "num_experts_per_tok"))
        if not 0 < self.top_k <= self.num_experts:
            raise InvalidArgumentError(
                f"config.json: num_experts_per_tok must be between 1 and the {self.num_experts} experts, "
                f"got {self.top_k}"
            )
        self.limit = float(config.raw.get("swiglu_limit", 7.0))
        self.alpha = float(config.raw.get("swiglu_alpha", SWIGLU_ALPHA))
        self.attention_kinds = sliding_layer_types(self.config, FULL, 2)
        #: the experts this rank computes (expert parallel over the tensor-parallel group)
        self.local_experts = self.parallel.shard_of(self.num_experts)
        #: whether the checkpoint's experts are MXFP4 blocks (set from its tensor names)
        self.mxfp4 = False

    def projection_biases(self) -> ProjectionBiases:
        attention = bool(self.config.raw.get("attention_bias", True))
        return ProjectionBiases(qkv=attention, o_proj=attention)

    def has_attention_sinks(self) -> bool:
        return True

    def rotary_tables(self, freq_factors: Any | None) -> tuple[Any, Any]:
        parameters = dict(self.config.raw.get("rope_parameters") or self.config.rope_scaling or DEFAULT_ROPE)
        base = float(parameters.pop("rope_theta", self.config.raw.get("rope_theta", 150000.0)))
        scaling = (
            parameters
            if parameters.get("rope_type", parameters.get("type")) not in (None, "default")
            else None
        )
        return rope_tables(base, self.head_dim, self.max_positions, scaling)

    def preprocess_weights(self, host: dict[str, Any]) -> None:
        self.mxfp4 = any(name.endswith("experts.gate_up_proj_blocks") for name in host)

    def _expert_tensor_names(self, experts: str) -> list[str]:
        if self.mxfp4:
            names = [experts + f"{part}_{kind}" for part in EXPERT_PARTS for kind in ("blocks", "scales")]
        else:
            names = [experts + part for part in EXPERT_PARTS]
        return names + [experts + f"{part}_bias" for part in EXPERT_PARTS]

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        mlp = prefix + "mlp."
        names = {mlp + "router.weight", mlp + "router.bias"}
        return names | set(self._expert_tensor_names(mlp + "experts."))

    def _expert_matrices(self, experts: str, part: str, host: dict[str, Any]) -> list[Any]:
        """Per expert of this rank (`local_experts`), `part`'s [out, in] matrix: MXFP4 blocks kept
        packed, or float transposed from transformers' [in, out]."""
        local = slice(self.local_experts.start, self.local_experts.stop)
        if self.mxfp4:
            blocks, scales = host[experts + part + "_blocks"], host[experts + part + "_scales"]
            if len(blocks) != self.num_experts or len(scales) != self.num_experts:
                raise InvalidArgumentError(
                    f"{experts + part}_blocks and _scales must hold {self.num_experts} experts, "
                    f"got {len(blocks)} and {len(scales)}"
                )
            return mxfp4_experts_to_ggml(blocks[local], scales[local], experts + part)
        stacked = np.asarray(host[experts + part], dtype=np.float32)
        if stacked.ndim != 3 or len(stacked) != self.num_experts:
            raise InvalidArgumentError(
                f"{experts + part} must be [{self.num_experts} experts, in, out], got {stacked.shape}"
            )
        return [np.ascontiguousarray(matrix.T) for matrix in stacked[local]]

    def load_mlp(self, layer: int, prefix: str, host: dict[str, Any]) -> GptOssBlock:
        backend, mlp = self.backend, prefix + "mlp."
        experts = mlp + "experts."
        gate_up = self._expert_matrices(experts, "gate_up_proj", host)
        down = self._expert_matrices(experts, "down_proj", host)
        gate_up_bias = np.asarray(host[experts + "gate_up_proj_bias"], dtype=np.float32)
        down_bias = np.asarray(host[experts + "down_proj_bias"], dtype=np.float32)
        inner = gate_up[0].shape[0] // 2
        # the checkpoint interleaves gate and up rows (gate at even rows): gate rows first here
        order = np.concatenate([np.arange(0, 2 * inner, 2), np.arange(1, 2 * inner, 2)])
        loaded = []
        for i, e in enumerate(self.local_experts):
            matrix = gate_up[i].take_rows(order) if self.mxfp4 else gate_up[i][order]
            loaded.append(
                (
                    backend.linear_weight(matrix),
                    backend.linear_bias(gate_up_bias[e][order]),
                    backend.linear_weight(down[i]),
                    backend.linear_bias(down_bias[e]),
                )
            )
        return GptOssBlock(
            router=backend.linear_weight(host[mlp + "router.weight"]),
            router_bias=backend.linear_bias(host[mlp + "router.bias"]),
            experts=loaded,
        )

    def _clamped_swiglu(self, gate_up: np.ndarray) -> np.ndarray:
        inner = gate_up.shape[1] // 2
        gate = np.minimum(gate_up[:, :inner], np.float32(self.limit))
        up = np.clip(gate_up[:, inner:], np.float32(-self.limit), np.float32(self.limit))
        glu = gate / (np.float32(1.0) + np.exp(-np.float32(self.alpha) * gate))
        return ((up + np.float32(1.0)) * glu).astype(np.float32)

    def mlp_block(self, layer: LlamaLayerWeights, x: Any) -> Any:
        """The routed experts on normed x: every token routed, only this rank's experts computed
        (its partial sum under tensor parallelism)."""
        ops, block, first = self.backend, layer.mlp, self.local_experts.start
        logits = np.asarray(ops.to_numpy(ops.linear(x, block.router, block.router_bias)), dtype=np.float32)
        chosen = np.argsort(-logits, axis=1, kind="stable")[:, : self.top_k]
        top = np.take_along_axis(logits, chosen, axis=1)
        weights = np.exp(top - top.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out = np.zeros((logits.shape[0], self.config.hidden_size), dtype=np.float32)
        for expert in np.unique(chosen):
            if int(expert) not in self.local_experts:
                continue
            rows, slot = np.nonzero(chosen == expert)
            gate_up, gate_up_bias, down, down_bias = block.experts[int(expert) - first]
            xs = ops.gather_rows(x, ops.from_numpy(rows.astype(np.int64)))
            hidden = self._clamped_swiglu(np.asarray(ops.to_numpy(ops.linear(xs, gate_up, gate_up_bias))))
            result = np.asarray(ops.to_numpy(ops.linear(ops.from_numpy(hidden), down, down_bias)))
            np.add.at(out, rows, result * weights[rows, slot][:, None])
        return ops.from_numpy(out)
