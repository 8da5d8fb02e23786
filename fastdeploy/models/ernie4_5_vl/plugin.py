"""Registers ERNIE-4.5-VL's model class and multimodal processor (built-in plugin)."""

from __future__ import annotations

from fastdeploy.input.ernie_templates import ERNIE_4_5_VL_CHAT_TEMPLATE
from fastdeploy.input.multimodal.ernie4_5_vl import build_processor
from fastdeploy.models.ernie4_5_vl.model import Ernie4_5_VLMoeForConditionalGeneration
from fastdeploy.plugins.api import hookimpl

ARCHITECTURES = ("Ernie4_5_VLMoeForConditionalGeneration", "Ernie4_5_VL_MoeForConditionalGeneration")


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return dict.fromkeys(ARCHITECTURES, Ernie4_5_VLMoeForConditionalGeneration)


@hookimpl
def fastdeploy_multimodal_processors() -> dict[str, object]:
    return dict.fromkeys(ARCHITECTURES, build_processor)


@hookimpl
def fastdeploy_chat_templates() -> dict[str, str]:
    """ERNIE-4.5-VL's template, for checkpoints whose tokenizer files carry none."""
    return dict.fromkeys(ARCHITECTURES, ERNIE_4_5_VL_CHAT_TEMPLATE)
