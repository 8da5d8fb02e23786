"""Images to vision-encoder patches, as ERNIE-4.5-VL's image processor makes them.

The steps are those of transformers' `Ernie4_5_VLMoeImageProcessorPil` (the reference the tests
compare with, to 1e-6): convert to RGB, resize with Pillow's bicubic filter to the size
`smart_resize` picks (both sides multiples of patch_size x merge_size = 28, the pixel count
within [min_pixels, max_pixels], the aspect ratio kept as closely as possible), scale to [0, 1]
in float64 then float32, normalise with CLIP's mean/std, and cut into 14x14 patches ordered by
2x2 merge block (the order in which the resampler merges them). Each patch is one row of
3 * 14 * 14 values (channel, row, column).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fastdeploy.input.multimodal.errors import MediaError, require_pillow

#: OpenAI CLIP's normalisation, which ERNIE-4.5-VL's processors use
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class PatchSettings:
    """How images are cut and how large they may be (`mm_processor_kwargs` can change the bounds)."""

    patch_size: int = 14
    merge_size: int = 2
    #: pixel bounds of a resized image (transformers' size.shortest_edge / size.longest_edge)
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 6177
    #: per-channel normalisation (a checkpoint's preprocessor_config.json may set other values)
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor` with the pixel count in [min_pixels, max_pixels]."""
    if min(height, width) < 1:
        raise MediaError(f"image is {width}x{height}: both sides must be at least 1 pixel")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(f"image is {width}x{height}: the aspect ratio must be at most {MAX_ASPECT_RATIO}:1")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(image: object) -> object:
    """An RGB PIL image; transparent pixels are composited on white, as transformers does."""
    Image = require_pillow()
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def normalized_chw(
    rgb: np.ndarray, mean: tuple[float, ...] = CLIP_MEAN, std: tuple[float, ...] = CLIP_STD
) -> np.ndarray:
    """uint8 [3, H, W] -> float32 [3, H, W]: scaled to [0, 1] (in float64, as transformers does),
    then (x - mean) / std per channel in float32."""
    scaled = (rgb.astype(np.float64) * (1 / 255)).astype(np.float32)
    return (scaled - np.array(mean, dtype=np.float32)[:, None, None]) / np.array(std, dtype=np.float32)[
        :, None, None
    ]


def patchify(frames: np.ndarray, settings: PatchSettings) -> np.ndarray:
    """float32 [T, 3, H, W] -> [T * (H/14) * (W/14), 3*14*14], patches ordered frame, 2x2 merge
    block (row-major), then row and column inside the block."""
    t, channels, height, width = frames.shape
    p, m = settings.patch_size, settings.merge_size
    grid_h, grid_w = height // p, width // p
    blocks = frames.reshape(t, channels, grid_h // m, m, p, grid_w // m, m, p)
    blocks = blocks.transpose(0, 2, 5, 3, 6, 1, 4, 7)
    return np.ascontiguousarray(blocks.reshape(t * grid_h * grid_w, channels * p * p))


def resize_rgb(image: object, height: int, width: int) -> np.ndarray:
    """uint8 [3, height, width] of an RGB PIL image resized with Pillow's bicubic filter."""
    Image = require_pillow()
    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.Resampling.BICUBIC)
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)


def preprocess_image(image: object, settings: PatchSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(patches [h*w, 588] float32, grid (1, h, w) in patches) of one PIL image."""
    rgb = to_rgb(image)
    width, height = rgb.size
    new_height, new_width = smart_resize(
        height, width, settings.factor, settings.min_pixels, settings.max_pixels
    )
    pixels = normalized_chw(resize_rgb(rgb, new_height, new_width))
    patches = patchify(pixels[None], settings)
    return patches, (1, new_height // settings.patch_size, new_width // settings.patch_size)
