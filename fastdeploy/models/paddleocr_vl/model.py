"""`PaddleOCRVLForConditionalGeneration`: ERNIE-4.5-0.3B's decoder fed by PaddleOCR-VL's encoder.

transformers' `PaddleOCRTextModel` is Llama-shaped (RMSNorm, GQA with an explicit head_dim,
SwiGLU, `use_bias` on every projection, tied embeddings by default) and applies its multimodal
rotary positions in rotate-half layout with `mrope_section` split into time, height and width
groups, as Qwen2.5-VL does: so the language side is `models.mrope_vl` on the Llama decoder, with
no q/k row permutation (unlike the ERNIE-4.5 text checkpoints).
"""

from __future__ import annotations

from typing import Any

from fastdeploy.models.ernie4_5 import use_bias_projections
from fastdeploy.models.llama import LlamaForCausalLM, ProjectionBiases
from fastdeploy.models.mrope_vl import MRopeVisionLanguage
from fastdeploy.models.paddleocr_vl.vision import VisionEncoder


class PaddleOCRVLForConditionalGeneration(MRopeVisionLanguage, LlamaForCausalLM):
    """PaddleOCR-VL (0.9B and tiny test models)."""

    default_rope_theta = 500000.0

    def projection_biases(self) -> ProjectionBiases:
        return use_bias_projections(self.config)

    def build_vision(self, vision: dict[str, Any]) -> VisionEncoder:
        return VisionEncoder(vision, self.backend)
