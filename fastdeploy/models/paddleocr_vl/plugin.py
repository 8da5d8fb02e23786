"""Registers PaddleOCR-VL's model class and multimodal processor (built-in plugin); its fallback chat
template is among the family templates of `fastdeploy.input.family_templates`."""

from __future__ import annotations

from fastdeploy.input.multimodal.paddleocr_vl import build_processor
from fastdeploy.models.paddleocr_vl.model import PaddleOCRVLForConditionalGeneration
from fastdeploy.plugins.api import hookimpl

ARCHITECTURES = ("PaddleOCRVLForConditionalGeneration",)


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return dict.fromkeys(ARCHITECTURES, PaddleOCRVLForConditionalGeneration)


@hookimpl
def fastdeploy_multimodal_processors() -> dict[str, object]:
    return dict.fromkeys(ARCHITECTURES, build_processor)
