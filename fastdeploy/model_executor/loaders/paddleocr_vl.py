"""PaddleOCR-VL checkpoints (`PaddleOCRVLForConditionalGeneration`).

The hub's names (`model.*` language model, `visual.vision_model.*`, `mlp_AR.*` projector) and
transformers 5's (`model.language_model.*`, `model.visual.*`, `model.projector.*`) reach the
model as `model.*`, `model.visual.vision_model.*` and `model.projector.*` (see `loaders.mrope_vl`).
Tensors transformers also ignores (`packing_position_embedding`, the unused `vision_model.head`)
are dropped. The image processor's settings of `preprocessor_config.json` (mean, std, pixel
bounds), where the directory has one, are kept in the config as `preprocessor_config`, so the
processor uses the checkpoint's own normalisation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.errors import WeightLoadError
from fastdeploy.model_executor.loaders.mrope_vl import MRopeVLLoader

ARCHITECTURES = ("PaddleOCRVLForConditionalGeneration",)
#: transformers' `PaddleOCRVisionConfig` defaults
_VISION_DEFAULTS = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 384,
    "patch_size": 14,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "spatial_merge_size": 2,
}
_UNUSED = ("packing_position_embedding", "vision_model.head.")
PREPROCESSOR_FILE = "preprocessor_config.json"


class PaddleOCRVLLoader(MRopeVLLoader):
    """PaddleOCR-VL safetensors directories in either naming layout."""

    name = "paddleocr_vl-safetensors"
    architectures = ARCHITECTURES
    vision_defaults = _VISION_DEFAULTS
    renames = (
        ("visual.", "model.visual."),
        ("mlp_AR.", "model.projector."),
        ("model.language_model.", "model."),
    )

    def load_config(self, model_path: str) -> dict[str, Any]:
        config = super().load_config(model_path)
        path = os.path.join(model_path, PREPROCESSOR_FILE)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as handle:
                    config["preprocessor_config"] = json.load(handle)
            except (OSError, json.JSONDecodeError) as exc:
                raise WeightLoadError(f"cannot read {path}: {exc}") from exc
        return config

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray]]:
        for name, array in super().load_tensors(model_path):
            if not any(part in name for part in _UNUSED):
                yield name, array
