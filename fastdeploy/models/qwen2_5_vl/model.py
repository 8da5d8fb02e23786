"""`Qwen2_5_VLForConditionalGeneration`: the Qwen2 language model fed by Qwen2.5-VL's vision tower.

The language model is Qwen2's (biased q/k/v) with multimodal rotary positions
(`models.mrope_vl`, shared with PaddleOCR-VL), checked against transformers by tests/models.
"""

from __future__ import annotations

from typing import Any

from fastdeploy.models.mrope_vl import MRopeVisionLanguage
from fastdeploy.models.qwen import Qwen2ForCausalLM
from fastdeploy.models.qwen2_5_vl.vision import VisionTower


class Qwen2_5_VLForConditionalGeneration(MRopeVisionLanguage, Qwen2ForCausalLM):
    """Qwen2.5-VL (3B, 7B, 32B, 72B and tiny test models)."""

    def build_vision(self, vision: dict[str, Any]) -> VisionTower:
        return VisionTower(vision, self.backend)
