"""ERNIE-4.5-VL checkpoints (`Ernie4_5_VLMoeForConditionalGeneration`), `-PT` and `-Paddle`.

Both layouts reach the model under the `-PT` on-disk names (see tests/models/tiny_vl_checkpoint.py
for the full list): the text model under `model.`, the vision tower under `model.vision_model.`
(the hub's -PT files put it at the root, `vision_model.`), the resampler under
`model.resampler_model.`. Routers (`mlp.gate.weight`, `mlp.gate.weight_1`) stay [hidden, experts]
as both layouts store them. From `-Paddle` checkpoints the text model's names and fused
projections are translated as for the ERNIE-4.5 text models, and every other 2-D linear weight
(vision tower, resampler) is transposed from Paddle's [in, out].

`load_config` returns one flat dict whatever the checkpoint's form: transformers' nested
`text_config` is lifted to the top level, and the rotary sections (`mrope_section`, from
`rope_parameters` or the -Paddle `freq_allocation`), the per-layer `mlp_layer_types` and the
vision tower's fields get one spelling each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.errors import WeightLoadError
from fastdeploy.model_executor.loaders.paddle_ernie import (
    PADDLE_PREFIX,
    PaddleErnieTranslator,
    checkpoint_tensor_names,
)
from fastdeploy.model_executor.loaders.safetensors_loader import SafetensorsLoader, declares_architecture

ARCHITECTURES = ("Ernie4_5_VLMoeForConditionalGeneration", "Ernie4_5_VL_MoeForConditionalGeneration")
_ROUTERS = (".mlp.gate.weight", ".mlp.gate.weight_1")


def _first(value: Any) -> Any:
    """The text entry of -Paddle's [text, vision] pairs."""
    return value[0] if isinstance(value, list) else value


def normalize_config(raw: dict[str, Any]) -> dict[str, Any]:
    """One flat config dict for both checkpoint layouts (see the module docstring)."""
    config = {k: v for k, v in raw.items() if k != "text_config"}
    config.update(raw.get("text_config") or {})
    config["architectures"] = list(raw.get("architectures") or [ARCHITECTURES[0]])
    if "tie_word_embeddings" in raw:
        config["tie_word_embeddings"] = raw["tie_word_embeddings"]
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    config["head_dim"] = head_dim
    rope = config.get("rope_parameters") or {}
    config["rope_theta"] = float(rope.get("rope_theta", config.get("rope_theta", 500000.0)))
    section = rope.get("mrope_section")
    if section is None:
        temporal = int(config.get("freq_allocation", 20 * head_dim // 128))
        spatial = (head_dim // 2 - temporal) // 2
        section = [spatial, spatial, temporal]
    config["mrope_section"] = [int(s) for s in section]
    experts = _first(config.get("moe_num_experts", 64))
    config["moe_num_experts"] = int(experts)
    inner = config.get("moe_intermediate_size")
    config["moe_intermediate_size"] = [int(v) for v in (inner if isinstance(inner, list) else [inner, inner])]
    if not config.get("mlp_layer_types"):
        layers = int(config["num_hidden_layers"])
        start = int(_first(config.get("moe_layer_start_index", 1)))
        end = int(_first(config.get("moe_layer_end_index", -1)))
        end = layers - 1 if end == -1 else end
        interval = int(config.get("moe_layer_interval", 1) or 1)
        config["mlp_layer_types"] = [
            "sparse" if start <= i <= end and (i + 1) % interval == 0 else "dense" for i in range(layers)
        ]
    config["vision_config"] = _vision_config(raw.get("vision_config") or {})
    if "image_token_id" not in config and "im_patch_id" in config:
        config["image_token_id"] = config["im_patch_id"]
    return config


def _vision_config(vision: dict[str, Any]) -> dict[str, Any]:
    hidden = int(vision.get("hidden_size") or vision.get("embed_dim") or 1280)
    rope = vision.get("rope_parameters") or {}
    return {
        "depth": int(vision.get("depth", 32)),
        "hidden_size": hidden,
        "num_heads": int(vision.get("num_heads", 16)),
        "intermediate_size": int(vision.get("intermediate_size") or hidden * vision.get("mlp_ratio", 4)),
        "in_channels": int(vision.get("in_channels") or vision.get("in_chans") or 3),
        "patch_size": int(vision.get("patch_size", 14)),
        "spatial_merge_size": int(vision.get("spatial_merge_size", 2)),
        "temporal_merge_size": int(vision.get("temporal_merge_size", 2)),
        "rms_norm_eps": float(vision.get("rms_norm_eps", vision.get("layer_norm_eps", 1e-6))),
        "rope_theta": float(rope.get("rope_theta", vision.get("rope_theta", 10000.0))),
        "hidden_act": vision.get("hidden_act", "quick_gelu"),
    }


class Ernie4_5_VLLoader(SafetensorsLoader):
    """ERNIE-4.5-VL safetensors directories in either layout."""

    name = "ernie4_5_vl-safetensors"
    priority = 10

    def can_load(self, model_path: str) -> bool:
        return super().can_load(model_path) and declares_architecture(model_path, ARCHITECTURES)

    def load_config(self, model_path: str) -> dict[str, Any]:
        return normalize_config(super().load_config(model_path))

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray]]:
        try:
            paddle = any(name.startswith(PADDLE_PREFIX) for name in checkpoint_tensor_names(model_path))
        except OSError as exc:
            raise WeightLoadError(f"cannot list the tensors of {model_path}: {exc}") from exc
        translator = PaddleErnieTranslator(self.load_config(model_path)) if paddle else None
        for name, array in super().load_tensors(model_path):
            if name.startswith(("vision_model.", "resampler_model.")):
                name = "model." + name
            if translator is None:
                yield name, array
            elif name.endswith(_ROUTERS):
                yield "model." + name[len(PADDLE_PREFIX) :], array
            elif name.startswith(("model.vision_model.", PADDLE_PREFIX + "resampler_model.")):
                name = name if name.startswith("model.") else "model." + name[len(PADDLE_PREFIX) :]
                yield name, array.T if array.ndim == 2 else array
            else:
                yield from translator.translate(name, array)
