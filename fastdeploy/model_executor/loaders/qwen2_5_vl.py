"""Qwen2.5-VL checkpoints (`Qwen2_5_VLForConditionalGeneration`).

The hub's names (`model.layers.*`, `visual.*`, `lm_head.weight`) and transformers 5's
(`model.language_model.*`, `model.visual.*`) reach the model with the language model under
`model.` (Qwen2's names) and the vision tower under `model.visual.`; see `loaders.mrope_vl`.
"""

from __future__ import annotations

from fastdeploy.model_executor.loaders.mrope_vl import MRopeVLLoader

ARCHITECTURES = ("Qwen2_5_VLForConditionalGeneration",)
_VISION_DEFAULTS = {
    "depth": 32,
    "hidden_size": 1280,
    "hidden_act": "silu",
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 3584,
    "fullatt_block_indexes": [7, 15, 23, 31],
}


class Qwen2_5_VLLoader(MRopeVLLoader):
    """Qwen2.5-VL safetensors directories in either naming layout."""

    name = "qwen2_5_vl-safetensors"
    architectures = ARCHITECTURES
    vision_defaults = _VISION_DEFAULTS
    renames = (("visual.", "model.visual."), ("model.language_model.", "model."))
