"""`Ernie4_5_VLMoeForConditionalGeneration`: ERNIE-4.5-VL's text model, fed by its vision encoder.

The text model is ERNIE-4.5's decoder (q/k rows permuted to rotate-half order at load, as for the
text models) with three differences, checked against transformers by tests/models:

- 3-D rotary positions (`rotary.py`): the processor gives each prompt token a
  (time, height, width) position; generated tokens continue at `next_position` on all axes.
- Layers listed as "sparse" in `mlp_layer_types` (all but the first, in the released models) are
  MoE layers with two expert sets: tokens of images and videos (their placeholders and start/end
  tokens) go to the vision experts with the vision router (`mlp.gate.weight_1`, correction bias
  row 1), all other tokens to the text experts (`mlp.gate.weight`, row 0); shared experts see
  every token. Experts `0..E-1` of the checkpoint are the text experts, `E..2E-1` the vision ones.
- Placeholder tokens take the vision encoder's output rows instead of their embedding.

The engine hands each sequence's `MultiModalPrompt` (or None for a text-only request) and the
token range it schedules; `encode` runs the vision encoder once per image per request and keeps
the result on the item, so chunked prefill and preemption reuse it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.ernie4_5 import Ernie4_5ForCausalLM, MoEWeights
from fastdeploy.models.ernie4_5_vl.rotary import inverse_frequencies, text_axes, text_tables
from fastdeploy.models.ernie4_5_vl.vision import VisionEncoder
from fastdeploy.models.llama import DenseMLPWeights, LlamaLayerWeights
from fastdeploy.models.multimodal_steps import SequenceSpan, embed_with_encoder_rows, step_rows
from fastdeploy.plugins.api import MultiModalItem


@dataclass
class ModalityMoEWeights:
    """One MoE layer: text experts, vision experts, shared experts."""

    text: MoEWeights
    vision: MoEWeights
    shared: DenseMLPWeights | None


@dataclass
class _StepInputs:
    """Per-forward data the layers read: rotary rows and which token rows are vision tokens."""

    cos: Any
    sin: Any
    positions: Any
    vision_rows: np.ndarray
    text_rows: np.ndarray


class Ernie4_5_VLMoeForConditionalGeneration(Ernie4_5ForCausalLM):
    """ERNIE-4.5-VL (28B-A3B, 424B-A47B and tiny test models)."""

    #: the engine builds a multimodal processor for this model and passes `extra_inputs=` spans
    supports_multimodal = True
    #: its own layer loop (vision experts, 3-D rotary) is not split over ranks: TP/PP > 1 is
    #: refused at start-up naming this architecture, rather than inherited from the text model
    supports_parallel = False
    #: `forward` reads the step's positions on the host to build the 3-D rotary tables
    supports_decode_graphs = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        raw = self.config.raw
        self.layer_types = list(raw["mlp_layer_types"])
        self.num_experts = int(raw["moe_num_experts"])
        self.top_k = int(raw.get("moe_k", 6))
        self.num_shared = int(raw.get("moe_num_shared_experts", 0) or 0)
        self.norm_min = float(raw.get("moe_norm_min", 1e-12))
        self.expert_sizes = list(raw["moe_intermediate_size"])
        self.inv_freq = inverse_frequencies(self.rope_theta(), self.head_dim)
        self.rope_axes = text_axes(self.head_dim, raw["mrope_section"])
        self.vision = VisionEncoder(
            raw["vision_config"], self.config.hidden_size, self.config.rms_norm_eps, self.backend
        )
        self._step: _StepInputs | None = None

    # --- weights -------------------------------------------------------------------------------
    def _expected_names(self) -> set[str]:
        return super()._expected_names() | self.vision.tensor_names()

    def preprocess_weights(self, host: dict[str, Any]) -> None:
        super().preprocess_weights(host)
        self.vision.load(host)

    def mlp_names(self, layer: int, prefix: str) -> set[str]:
        if self.layer_types[layer] != "sparse":
            return super().mlp_names(layer, prefix)
        mlp = prefix + "mlp."
        names = {mlp + "gate.weight", mlp + "gate.weight_1", mlp + "moe_statics.e_score_correction_bias"}
        for expert in range(2 * self.num_experts):
            names.update(f"{mlp}experts.{expert}.{part}_proj.weight" for part in ("gate", "up", "down"))
        if self.num_shared:
            names.update(self.dense_mlp_names(mlp + "shared_experts."))
        return names

    def load_mlp(self, layer: int, prefix: str, host: dict[str, Any]) -> Any:
        if self.layer_types[layer] != "sparse":
            return super().load_mlp(layer, prefix, host)
        backend = self.backend
        mlp = prefix + "mlp."
        bias = np.asarray(host[mlp + "moe_statics.e_score_correction_bias"], dtype=np.float32).reshape(2, -1)

        def experts(first: int, router: str, row: int) -> MoEWeights:
            names = [f"{mlp}experts.{e}." for e in range(first, first + self.num_experts)]
            return MoEWeights(
                gate=backend.linear_weight(np.asarray(host[mlp + router]).T),
                correction_bias=backend.from_numpy(bias[row]),
                experts=backend.moe_expert_weights(
                    [host[p + "gate_proj.weight"] for p in names],
                    [host[p + "up_proj.weight"] for p in names],
                    [host[p + "down_proj.weight"] for p in names],
                ),
                shared=None,
            )

        return ModalityMoEWeights(
            text=experts(0, "gate.weight", 0),
            vision=experts(self.num_experts, "gate.weight_1", 1),
            shared=self.load_dense_mlp(mlp + "shared_experts.", host) if self.num_shared else None,
        )

    # --- vision ----------------------------------------------------------------------------------
    def encode(self, item: MultiModalItem) -> Any:
        """The item's embedding rows, computed once and kept on the item."""
        if item.embeddings is None:
            item.embeddings = self.vision.encode(item.patches, item.grid_thw)
        return item.embeddings

    # --- forward ---------------------------------------------------------------------------------
    def _step_inputs(
        self, positions: np.ndarray, spans: list[SequenceSpan] | None
    ) -> tuple[_StepInputs, list]:
        rows = step_rows(positions, spans, self.encode)
        cos, sin = text_tables(rows.positions, self.inv_freq, self.rope_axes)
        ops = self.backend
        step = _StepInputs(
            cos=ops.from_numpy(cos),
            sin=ops.from_numpy(sin),
            positions=ops.from_numpy(np.arange(positions.shape[0], dtype=np.int64)),
            vision_rows=np.flatnonzero(rows.vision),
            text_rows=np.flatnonzero(~rows.vision),
        )
        return step, rows.embeddings

    def forward(
        self,
        input_ids: Any,
        positions: Any,
        batch: Any,
        kv_caches: list[Any],
        extra_inputs: list[SequenceSpan] | None = None,
    ) -> Any:
        ops = self.backend
        host_positions = np.asarray(ops.to_numpy(positions), dtype=np.int64)
        step, embeddings = self._step_inputs(host_positions, extra_inputs)
        hidden = embed_with_encoder_rows(ops, ops.embedding(input_ids, self.embed_tokens), embeddings)
        self._step = step
        try:
            residual = None
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                hidden, residual = self.layer_forward(
                    layer, hidden, residual, step.positions, step.cos, step.sin, batch, kv_cache
                )
            normed, _ = ops.rms_norm(hidden, self.final_norm, self.config.rms_norm_eps, residual)
        finally:
            self._step = None
        return normed

    def _routed(self, moe: MoEWeights, x: Any) -> Any:
        ops = self.backend
        weights, ids = ops.moe_route(
            ops.linear(x, moe.gate), self.top_k, moe.correction_bias, renormalize=True, norm_min=self.norm_min
        )
        return ops.moe_experts(x, moe.experts, weights, ids)

    def mlp_block(self, layer: LlamaLayerWeights, x: Any) -> Any:
        moe = layer.mlp
        if not isinstance(moe, ModalityMoEWeights):
            return self.dense_mlp(moe, x)
        ops, step = self.backend, self._step
        if not step.vision_rows.size:
            out = self._routed(moe.text, x)
        else:
            parts = []
            for weights, rows in ((moe.text, step.text_rows), (moe.vision, step.vision_rows)):
                if rows.size:
                    parts.append((self._routed(weights, ops.gather_rows(x, ops.from_numpy(rows))), rows))
            out = ops.merge_rows(parts, x.shape[0])
        if moe.shared is not None:
            out = out + self.dense_mlp(moe.shared, x)
        return out
