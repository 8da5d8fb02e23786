"""Qwen2.5-VL checkpoints (`Qwen2_5_VLForConditionalGeneration`).

Two naming layouts reach the model under one set of names: the hub's (`model.layers.*`,
`visual.*`, `lm_head.weight`) and the one transformers 5 writes (`model.language_model.*`,
`model.visual.*`). The language model ends up under `model.` (Qwen2's names) and the vision
tower under `model.visual.`.

`load_config` returns one flat dict: transformers 5's nested `text_config` is lifted to the top
level, the rotary sections get one spelling (`mrope_section`, from `rope_parameters` or the hub's
`rope_scaling` of type "mrope", which is not a frequency scaling and is removed), and the vision
tower's fields get their defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.loaders.safetensors_loader import SafetensorsLoader, declares_architecture

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


def normalize_config(raw: dict[str, Any]) -> dict[str, Any]:
    """One flat config dict for both layouts (see the module docstring)."""
    config = {k: v for k, v in raw.items() if k != "text_config"}
    config.update(raw.get("text_config") or {})
    config["architectures"] = list(raw.get("architectures") or [ARCHITECTURES[0]])
    for key in ("tie_word_embeddings", "image_token_id", "video_token_id"):
        if key in raw:
            config[key] = raw[key]
    rope = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or {}
    if (scaling.get("type") or scaling.get("rope_type")) == "mrope" or "mrope_section" in scaling:
        rope = {**scaling, **rope}
        config["rope_scaling"] = None
    section = rope.get("mrope_section")
    if section is None:
        raise InvalidArgumentError("config.json: Qwen2.5-VL needs rope_parameters.mrope_section")
    config["mrope_section"] = [int(s) for s in section]
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = float(rope["rope_theta"])
    vision = {**_VISION_DEFAULTS, **(raw.get("vision_config") or {})}
    vision["rope_theta"] = float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    config["vision_config"] = vision
    return config


class Qwen2_5_VLLoader(SafetensorsLoader):
    """Qwen2.5-VL safetensors directories in either naming layout."""

    name = "qwen2_5_vl-safetensors"
    priority = 10

    def can_load(self, model_path: str) -> bool:
        return super().can_load(model_path) and declares_architecture(model_path, ARCHITECTURES)

    def load_config(self, model_path: str) -> dict[str, Any]:
        return normalize_config(super().load_config(model_path))

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray]]:
        for name, array in super().load_tensors(model_path):
            if name.startswith("visual."):
                name = "model." + name
            elif name.startswith("model.language_model."):
                name = "model." + name[len("model.language_model.") :]
            yield name, array
