"""PaddleOCR-VL's multimodal processor: images in, expanded prompt and vision-encoder inputs out.

The chat template marks an image with `<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>` (the
ids of config.json's `image_token_id`, `vision_start_token_id`, `vision_end_token_id`);
FastDeploy's `<|image@placeholder|>` is accepted in text prompts too, and token-id prompts mark
images with runs of the placeholder id. Each placeholder becomes h*w/4 tokens for an image of
grid (1, h, w) in 14-pixel patches (the projector's 2x2 merge), as transformers'
`PaddleOCRVLProcessor` expands it; rotary positions are those of ERNIE-4.5-VL and Qwen2.5-VL.

Pixels are those of transformers' `PaddleOCRVLImageProcessor` (the tests compare with its PIL
backend): RGB conversion, its `smart_resize` (a side under 28 pixels is first scaled up to 28
keeping the aspect ratio, then Qwen2-VL's rounding to multiples of 28 within [min_pixels,
max_pixels], by default [384*384, 1536*1536]), bicubic resize, normalisation (CLIP's mean/std by
default; a checkpoint's preprocessor_config.json may give others, as PaddleOCR-VL's does), then
14x14 patches in raster order, each one row of 3 * 14 * 14 values (channel, row, column).
Videos are refused naming the part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from fastdeploy.input.multimodal.ernie4_5_vl import ProcessorSettings
from fastdeploy.input.multimodal.errors import MediaError
from fastdeploy.input.multimodal.image_processor import (
    PatchSettings,
    normalized_chw,
    resize_rgb,
    smart_resize,
    to_rgb,
)
from fastdeploy.input.multimodal.qwen2_5_vl import ImageOnlyProcessor, vision_tokens

#: transformers' `PaddleOCRVLImageProcessor` bounds (size.shortest_edge / size.longest_edge)
IMAGE_SETTINGS = PatchSettings(min_pixels=384 * 384, max_pixels=1536 * 1536)
#: PaddleOCR-VL's spellings of its special tokens (image, vision start, vision end, video)
SPELLINGS = ("<|IMAGE_PLACEHOLDER|>", "<|IMAGE_START|>", "<|IMAGE_END|>", "<|VIDEO_PLACEHOLDER|>")


def resized_size(height: int, width: int, settings: PatchSettings) -> tuple[int, int]:
    """The resized (height, width): a side below the factor is scaled up to it first."""
    factor = settings.factor
    if height < factor:
        width, height = round(width * factor / height), factor
    if width < factor:
        height, width = round(height * factor / width), factor
    return smart_resize(height, width, factor, settings.min_pixels, settings.max_pixels)


def raster_patches(pixels: np.ndarray, patch_size: int) -> np.ndarray:
    """float32 [3, H, W] -> [(H/p) * (W/p), 3 * p * p], patches in raster order."""
    channels, height, width = pixels.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    blocks = pixels.reshape(channels, grid_h, patch_size, grid_w, patch_size).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(blocks.reshape(grid_h * grid_w, channels * patch_size * patch_size))


def preprocess_image(image: object, settings: PatchSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(patches [h*w, 3*14*14] float32, grid (1, h, w) in patches) of one PIL image."""
    rgb = to_rgb(image)
    width, height = rgb.size
    new_height, new_width = resized_size(height, width, settings)
    pixels = normalized_chw(resize_rgb(rgb, new_height, new_width), settings.mean, settings.std)
    patches = raster_patches(pixels, settings.patch_size)
    return patches, (1, new_height // settings.patch_size, new_width // settings.patch_size)


class PaddleOCRVLProcessor(ImageOnlyProcessor):
    """PaddleOCR-VL's pixels (raster-order patches, one frame)."""

    family = "PaddleOCR-VL"

    def preprocess(self, image: object, settings: PatchSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
        return preprocess_image(image, settings)


def _channels(value: Any, field: str) -> tuple[float, float, float]:
    values = [value] * 3 if isinstance(value, (int, float)) else list(value)
    if len(values) != 3:
        raise MediaError(f"preprocessor_config.json: {field} must have 3 values, got {value!r}")
    return tuple(float(v) for v in values)


def image_settings(vision: Mapping[str, Any], preprocessor: Mapping[str, Any]) -> PatchSettings:
    """The checkpoint's patch sizes (vision_config) and image bounds and normalisation
    (preprocessor_config.json, in transformers' old or new spelling), else transformers' defaults."""
    size = preprocessor.get("size") or {}
    return dataclasses.replace(
        IMAGE_SETTINGS,
        patch_size=int(vision.get("patch_size", 14)),
        merge_size=int(vision.get("spatial_merge_size", 2)),
        min_pixels=int(
            preprocessor.get("min_pixels") or size.get("shortest_edge") or IMAGE_SETTINGS.min_pixels
        ),
        max_pixels=int(
            preprocessor.get("max_pixels") or size.get("longest_edge") or IMAGE_SETTINGS.max_pixels
        ),
        mean=_channels(preprocessor.get("image_mean", IMAGE_SETTINGS.mean), "image_mean"),
        std=_channels(preprocessor.get("image_std", IMAGE_SETTINGS.std), "image_std"),
    )


def build_processor(tokenizer: Any, model_config: Any, options: Any) -> PaddleOCRVLProcessor:
    """The `fastdeploy_multimodal_processors` factory of PaddleOCR-VL."""
    raw = model_config.raw
    image = image_settings(raw.get("vision_config", {}), raw.get("preprocessor_config") or {})
    settings = dataclasses.replace(ProcessorSettings(), image=image).updated(options.mm_processor_kwargs)
    return PaddleOCRVLProcessor(tokenizer, vision_tokens(tokenizer, raw, SPELLINGS), settings, options.policy)
