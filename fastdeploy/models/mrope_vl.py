"""The language-model side shared by vision-language models with multimodal (3-D) rotary positions
(Qwen2.5-VL, PaddleOCR-VL), checked against transformers by tests/models.

Each prompt token has a (time, height, width) position from the processor, and the head's
frequencies are split by `mrope_section` into a time group, a height group and a width group (in
that order, rotate-half layout), each turning with its own coordinate. Text tokens have equal
coordinates, so a text-only batch is ordinary rotary and runs the text model's path unchanged.
Placeholder tokens take the vision encoder's output rows instead of their embedding; `encode`
runs the encoder once per image per request and keeps the result on the item, so chunked prefill
and preemption reuse it.

A model mixes `MRopeVisionLanguage` in before its Llama-shaped text class and says how to build
its vision encoder (`build_vision`: an object with `tensor_names`, `load` and `encode`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdeploy.models.ernie4_5_vl.rotary import inverse_frequencies, text_tables
from fastdeploy.models.multimodal_steps import SequenceSpan, embed_with_encoder_rows, step_rows
from fastdeploy.plugins.api import InvalidArgumentError, MultiModalItem


class MRopeVisionLanguage:
    """Mixin of a `LlamaForCausalLM` subclass: vision encoder rows and 3-D rotary positions."""

    #: the engine builds a multimodal processor for this model and passes `extra_inputs=` spans
    supports_multimodal = True
    #: the multimodal forward is not split over ranks: TP/PP > 1 is refused at start-up naming
    #: the architecture
    supports_parallel = False
    #: `forward` reads the step's positions on the host to build the 3-D rotary tables
    supports_decode_graphs = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        raw = self.config.raw
        section = [int(s) for s in raw["mrope_section"]]
        if sum(section) != self.head_dim // 2:
            raise InvalidArgumentError(
                f"config.json of {self.config.architecture}: mrope_section {section} must add up to "
                f"head_dim / 2 = {self.head_dim // 2}"
            )
        self.inv_freq = inverse_frequencies(self.rope_theta(), self.head_dim)
        self.rope_axes = np.repeat(np.arange(3), section)
        self.vision = self.build_vision(raw["vision_config"])

    def build_vision(self, vision: dict[str, Any]) -> Any:
        """The vision encoder of this architecture (its `encode` gives text-width rows)."""
        raise NotImplementedError

    def _expected_names(self) -> set[str]:
        return super()._expected_names() | self.vision.tensor_names()

    def preprocess_weights(self, host: dict[str, Any]) -> None:
        super().preprocess_weights(host)
        self.vision.load(host)

    def encode(self, item: MultiModalItem) -> Any:
        """The item's embedding rows, computed once and kept on the item."""
        if item.embeddings is None:
            item.embeddings = self.vision.encode(item.patches, item.grid_thw)
        return item.embeddings

    def forward(
        self,
        input_ids: Any,
        positions: Any,
        batch: Any,
        kv_caches: list[Any],
        extra_inputs: list[SequenceSpan] | None = None,
    ) -> Any:
        if extra_inputs is None:
            return super().forward(input_ids, positions, batch, kv_caches)
        ops = self.backend
        host_positions = np.asarray(ops.to_numpy(positions), dtype=np.int64)
        rows = step_rows(host_positions, extra_inputs, self.encode)
        cos, sin = text_tables(rows.positions, self.inv_freq, self.rope_axes)
        cos, sin = ops.from_numpy(cos), ops.from_numpy(sin)
        step_positions = ops.from_numpy(np.arange(host_positions.shape[0], dtype=np.int64))
        hidden = embed_with_encoder_rows(ops, ops.embedding(input_ids, self.embed_tokens), rows.embeddings)
        residual = None
        if self.dense_layers is not None:
            hidden, residual = ops.decoder_layers(
                hidden, residual, self.dense_layers, step_positions, cos, sin, batch, kv_caches
            )
        else:
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                hidden, residual = self.layer_forward(
                    layer, hidden, residual, step_positions, cos, sin, batch, kv_cache
                )
        normed, _ = ops.rms_norm(hidden, self.final_norm, self.config.rms_norm_eps, residual)
        return normed
