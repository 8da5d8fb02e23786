"""Safetensors directories of vision-language models with multimodal (3-D) rotary positions
(Qwen2.5-VL, PaddleOCR-VL): one loader shape, each family giving its names and defaults.

Two naming layouts reach the model under one set of names: the hub's and the one transformers 5
writes in memory; `renames` maps checkpoint prefixes (first match wins) so that the language
model ends up under `model.` (the Llama names) and the vision side under the family's prefixes.

`load_config` returns one flat dict: transformers 5's nested `text_config` is lifted to the top
level, the rotary sections get one spelling (`mrope_section`, from `rope_parameters` or the hub's
`rope_scaling`, whose "mrope" entry is not a frequency scaling and is removed), and the vision
config gets the family's defaults (transformers' defaults of its vision config class) and its
rotary base as `rope_theta`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.loaders.safetensors_loader import SafetensorsLoader, declares_architecture


def normalize_config(
    raw: dict[str, Any], architecture: str, vision_defaults: dict[str, Any]
) -> dict[str, Any]:
    """One flat config dict for both layouts (see the module docstring)."""
    config = {k: v for k, v in raw.items() if k != "text_config"}
    config.update(raw.get("text_config") or {})
    config["architectures"] = list(raw.get("architectures") or [architecture])
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
        raise InvalidArgumentError(
            f"config.json of {architecture} lacks the required field 'mrope_section' "
            "(in rope_parameters, or rope_scaling in the hub's layout)"
        )
    config["mrope_section"] = [int(s) for s in section]
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = float(rope["rope_theta"])
    vision = {**vision_defaults, **(raw.get("vision_config") or {})}
    vision["rope_theta"] = float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    config["vision_config"] = vision
    return config


class MRopeVLLoader(SafetensorsLoader):
    """A family's directories in either naming layout; subclasses set the class attributes."""

    priority = 10
    #: the architectures (config.json `architectures`) this loader claims
    architectures: ClassVar[tuple[str, ...]] = ()
    #: vision_config fields a checkpoint may leave out, with transformers' defaults
    vision_defaults: ClassVar[dict[str, Any]] = {}
    #: (checkpoint prefix, our prefix) pairs, the first match renamed
    renames: ClassVar[tuple[tuple[str, str], ...]] = ()

    def can_load(self, model_path: str) -> bool:
        return super().can_load(model_path) and declares_architecture(model_path, self.architectures)

    def load_config(self, model_path: str) -> dict[str, Any]:
        return normalize_config(super().load_config(model_path), self.architectures[0], self.vision_defaults)

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray]]:
        for name, array in super().load_tensors(model_path):
            for old, new in self.renames:
                if name.startswith(old):
                    name = new + name[len(old) :]
                    break
            yield name, array
