"""Qwen2.5-VL's multimodal processor: images in, expanded prompt and vision-tower inputs out.

The chat template marks an image with `<|vision_start|><|image_pad|><|vision_end|>`; FastDeploy's
`<|image@placeholder|>` is accepted in text prompts too, and token-id prompts mark images with
runs of the `<|image_pad|>` id. Each placeholder becomes h*w/4 tokens for an image of grid
(1, h, w) in 14-pixel patches (the 2x2 patch merger's output rows), as transformers'
`Qwen2_5_VLProcessor` expands it.

Pixels are those of transformers' `Qwen2VLImageProcessor` (the tests compare with its PIL
backend): the same RGB conversion, `smart_resize` (factor 28, default pixel bounds
[56*56, 28*28*1280]), bicubic resize and CLIP normalisation as ERNIE-4.5-VL's processor, then
each 14x14 patch is repeated over the `temporal_patch_size` (2) frames the vision tower's 3-D
patch embedding reads, giving rows of 3 * 2 * 14 * 14 values (channel, frame, row, column).

Rotary positions are transformers' `get_rope_index` for images, the same as ERNIE-4.5-VL's:
(start, start + row, start + column), text after an image resuming at start + max(h, w)/2.
Videos are not supported yet and are refused naming the part (`ImageOnlyProcessor`, which
PaddleOCR-VL's processor shares).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from fastdeploy.input.multimodal.ernie4_5_vl import (
    Ernie4_5_VLProcessor,
    ProcessorSettings,
    VisionTokens,
)
from fastdeploy.input.multimodal.errors import MediaError
from fastdeploy.input.multimodal.image_processor import (
    PatchSettings,
    normalized_chw,
    resize_rgb,
    smart_resize,
    to_rgb,
)
from fastdeploy.input.multimodal.media import MediaPolicy, load_image

#: transformers' `Qwen2VLImageProcessor` bounds (size.shortest_edge / size.longest_edge)
IMAGE_SETTINGS = PatchSettings(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)


def temporal_patches(pixels: np.ndarray, settings: PatchSettings, temporal_patch_size: int) -> np.ndarray:
    """float32 [3, H, W] of one image -> [(H/14) * (W/14), 3 * tp * 14 * 14]: patches ordered by 2x2
    merge block, each patch's values repeated over the tp frames of the 3-D patch embedding."""
    channels, height, width = pixels.shape
    p, m = settings.patch_size, settings.merge_size
    grid_h, grid_w = height // p, width // p
    blocks = pixels.reshape(channels, grid_h // m, m, p, grid_w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], temporal_patch_size, p, p))
    return np.ascontiguousarray(frames.reshape(grid_h * grid_w, channels * temporal_patch_size * p * p))


def preprocess_image(
    image: object, settings: PatchSettings, temporal_patch_size: int = 2
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(patches [h*w, 3*tp*14*14] float32, grid (1, h, w) in patches) of one PIL image."""
    rgb = to_rgb(image)
    width, height = rgb.size
    new_height, new_width = smart_resize(
        height, width, settings.factor, settings.min_pixels, settings.max_pixels
    )
    pixels = normalized_chw(resize_rgb(rgb, new_height, new_width))
    patches = temporal_patches(pixels, settings, temporal_patch_size)
    return patches, (1, new_height // settings.patch_size, new_width // settings.patch_size)


class ImageOnlyProcessor(Ernie4_5_VLProcessor):
    """ERNIE-4.5-VL's placeholder expansion and positions with a family's own pixels; images only
    (videos are refused naming the part). Subclasses set `family` and `preprocess`."""

    #: the model family named in errors
    family = ""

    def preprocess(self, image: object, settings: PatchSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
        """(patch rows, grid (1, h, w)) of one PIL image."""
        raise NotImplementedError

    def _image(self, value: Any, what: str, settings: ProcessorSettings, policy: MediaPolicy) -> tuple:
        return self.preprocess(load_image(value, what, policy), settings.image)

    def _video(self, value: Any, what: str, settings: ProcessorSettings, policy: MediaPolicy) -> tuple:
        raise MediaError(f"{what}: videos are not supported for {self.family} yet; send images")


class Qwen2_5_VLProcessor(ImageOnlyProcessor):
    """Qwen2.5-VL's pixels (each patch repeated over the 3-D patch embedding's frames)."""

    family = "Qwen2.5-VL"

    def __init__(
        self,
        tokenizer: Any,
        tokens: VisionTokens,
        settings: ProcessorSettings,
        policy: MediaPolicy | None = None,
        temporal_patch_size: int = 2,
    ) -> None:
        super().__init__(tokenizer, tokens, settings, policy)
        self.temporal_patch_size = temporal_patch_size

    def preprocess(self, image: object, settings: PatchSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
        return preprocess_image(image, settings, self.temporal_patch_size)


#: Qwen2.5-VL's spellings of its special tokens (image, vision start, vision end, video)
QWEN_SPELLINGS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>")


def vision_tokens(
    tokenizer: Any, config: Mapping[str, Any], spellings: tuple[str, str, str, str] = QWEN_SPELLINGS
) -> VisionTokens:
    """Special ids from config.json (transformers' names), else the tokenizer's vocabulary."""

    def resolve(key: str, spelling: str) -> int:
        value = config.get(key)
        if value is None and tokenizer is not None:
            ids = tokenizer.encode(spelling, add_special_tokens=False)
            value = ids[0] if len(ids) == 1 else None
        if value is None:
            raise MediaError(
                f"cannot find the {spelling} token: config.json has no {key} and the tokenizer lacks it"
            )
        return int(value)

    image_spelling, start_spelling, end_spelling, video_spelling = spellings
    image = resolve("image_token_id", image_spelling)
    start = resolve("vision_start_token_id", start_spelling)
    end = resolve("vision_end_token_id", end_spelling)
    return VisionTokens(
        image=image,
        image_start=start,
        image_end=end,
        video=resolve("video_token_id", video_spelling),
        video_start=start,
        video_end=end,
    )


def build_processor(tokenizer: Any, model_config: Any, options: Any) -> Qwen2_5_VLProcessor:
    """The `fastdeploy_multimodal_processors` factory of Qwen2.5-VL."""
    raw = model_config.raw
    vision = raw.get("vision_config", {})
    image = dataclasses.replace(
        IMAGE_SETTINGS,
        patch_size=int(vision.get("patch_size", 14)),
        merge_size=int(vision.get("spatial_merge_size", 2)),
    )
    settings = dataclasses.replace(ProcessorSettings(), image=image).updated(options.mm_processor_kwargs)
    return Qwen2_5_VLProcessor(
        tokenizer,
        vision_tokens(tokenizer, raw),
        settings,
        options.policy,
        int(vision.get("temporal_patch_size", 2)),
    )
