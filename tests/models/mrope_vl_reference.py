"""transformers' greedy tokens for the 3-D rotary vision-language tests (Qwen2.5-VL, PaddleOCR-VL):
each test module gives its own reference processor's pixels and grids and its placeholder id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

IMAGES = Path(__file__).resolve().parents[1] / "fixtures" / "images"


def open_images(names: list[str]) -> list:
    return [Image.open(IMAGES / name).convert("RGB") for name in names]


def transformers_greedy(
    model,
    ids: list[int],
    pixels: np.ndarray | None,
    grids: np.ndarray | None,
    image_pad: int,
    new_tokens: int,
) -> list[int]:
    """transformers' greedy tokens; each placeholder expanded to its image's merged patches (a
    2 x 2 merge: t * h * w / 4) from the reference processor's grids."""
    expanded: list[int] = []
    grid_iter = iter(grids if grids is not None else [])
    for token in ids:
        if token == image_pad:
            t, h, w = next(grid_iter)
            expanded.extend([image_pad] * int(t * h * w // 4))
        else:
            expanded.append(token)
    input_ids = torch.tensor([expanded])
    kwargs = {}
    if pixels is not None:
        kwargs = {
            "pixel_values": torch.from_numpy(pixels),
            "image_grid_thw": torch.from_numpy(grids),
            "mm_token_type_ids": (input_ids == image_pad).int(),
        }
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            **kwargs,
        )
    return out[0, len(expanded) :].tolist()
