"""Registers Qwen2.5-VL's model class and multimodal processor (built-in plugin); its fallback chat
template is among the family templates of `fastdeploy.input.family_templates`."""

from __future__ import annotations

from fastdeploy.input.multimodal.qwen2_5_vl import build_processor
from fastdeploy.models.qwen2_5_vl.model import Qwen2_5_VLForConditionalGeneration
from fastdeploy.plugins.api import hookimpl

ARCHITECTURES = ("Qwen2_5_VLForConditionalGeneration",)


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return dict.fromkeys(ARCHITECTURES, Qwen2_5_VLForConditionalGeneration)


@hookimpl
def fastdeploy_multimodal_processors() -> dict[str, object]:
    return dict.fromkeys(ARCHITECTURES, build_processor)
