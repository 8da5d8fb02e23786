"""Reference outputs of ERNIE-4.5-VL's processor and model, from transformers.

Why this exists
---------------
fastdeploy implements ERNIE-4.5-VL's image/video processing and `Ernie4_5_VLMoeForConditionalGeneration`
itself. This tool runs transformers' own implementations on the same inputs and writes what the
tests compare with, so CI needs neither torch nor transformers:

* tests/fixtures/ernie4_5_vl_pixels.npz: `Ernie4_5_VLMoeImageProcessorPil` pixel values and grids
  of the real photographs in tests/fixtures/images/ (default bounds, and tighter bounds that force
  a downscale and an upscale), and `Ernie4_5_VLMoeVideoProcessor` pixel values of a clip whose
  frames are crops of a photograph;
* tests/fixtures/ernie4_5_vl_references.json: for the tiny random-weight checkpoint of
  tests/models/tiny_vl_checkpoint.py (loaded with `from_pretrained`, which must report no missing or
  unexpected tensors), the expanded prompt, 24 greedy tokens and every step's last-position logits
  for a text-only prompt, one image, two images of different sizes and a video (full forward passes
  without KV cache, no EOS stop), with the smallest top-1/top-2 margin.

transformers' video processor imports torchvision; the PyPI torchvision wheel is a CUDA build whose
meta-kernel registrations need its C extension, which cannot load against the CPU torch here. The
processor uses only torchvision's pure-torch functions, so an empty stand-in for
`torchvision._meta_registrations` is enough. Regenerate with::

    pip install --no-deps --target /work/envs/tv14 torchvision==0.28.0
    PYTHONPATH=/work/envs/tv14:. HF_HUB_OFFLINE=1 /work/refenv/bin/python tools/make_vl_references.py
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import (  # noqa: E402
    Ernie4_5_VLMoeForConditionalGeneration,
    Ernie4_5_VLMoeImageProcessorPil,
    Ernie4_5_VLMoeVideoProcessor,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "models"))
import tiny_vl_checkpoint as tiny  # noqa: E402
from tiny_checkpoints import weights_checksum  # noqa: E402

FIXTURES = REPO_ROOT / "tests" / "fixtures"
IMAGES = FIXTURES / "images"
NEW_TOKENS = 24
DECIMALS = 6
#: image processor bounds the pixel fixture covers: defaults, a forced downscale, a forced upscale
IMAGE_BOUNDS = {"default": None, "small": (28 * 28 * 4, 28 * 28 * 20), "large": (28 * 28 * 40, 28 * 28 * 60)}
#: video bounds of the model cases: the 56x84 frames are kept as they are
VIDEO_BOUNDS = (28 * 28 * 4, 28 * 28 * 8)

#: clips of the pixel fixture: frames at their target size, and frames the processor resizes
#: (70x100 -> 56x112: rows shrink, columns grow)
PIXEL_VIDEOS = {
    "kept": {"source": "astronaut_211x130.jpg", "frames": 6, "size": [84, 56], "step": 9},
    "resized": {"source": "astronaut_211x130.jpg", "frames": 5, "size": [100, 70], "step": 20},
}

CASES: list[dict[str, Any]] = [
    {"name": "text", "prompt_token_ids": [1, 17, 42, 99, 5, 63, 120, 11, 23]},
    {
        "name": "one_image",
        "prompt_token_ids": [1, 17, 42, tiny.IMAGE_START, tiny.IMAGE_TOKEN, tiny.IMAGE_END, 99, 5, 63],
        "images": ["chelsea_180x120.png"],
    },
    {
        "name": "two_images",
        "prompt_token_ids": [1, 17, tiny.IMAGE_START, tiny.IMAGE_TOKEN, tiny.IMAGE_END, 42, 99]
        + [tiny.IMAGE_START, tiny.IMAGE_TOKEN, tiny.IMAGE_END, 5, 63],
        "images": ["coffee_250x97.png", "rocket_90x200.png"],
    },
    {
        "name": "video",
        "prompt_token_ids": [1, 17, tiny.VIDEO_START, tiny.VIDEO_TOKEN, tiny.VIDEO_END, 42, 99],
        "video": {"source": "astronaut_211x130.jpg", "frames": 6, "size": [84, 56], "step": 9},
    },
]


def video_frames(spec: dict[str, Any]) -> list[np.ndarray]:
    """Crops of a photograph panning right by `step` pixels: a short clip of real image content."""
    photo = np.asarray(Image.open(IMAGES / spec["source"]).convert("RGB"))
    width, height = spec["size"]
    return [
        photo[10 : 10 + height, i * spec["step"] : i * spec["step"] + width] for i in range(spec["frames"])
    ]


def rounded(values: torch.Tensor) -> list[Any]:
    return np.round(values.double().numpy(), DECIMALS).tolist()


def pixel_fixture() -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for path in sorted(IMAGES.glob("*")):
        image = Image.open(path)
        for label, bounds in IMAGE_BOUNDS.items():
            kwargs = (
                {} if bounds is None else {"size": {"shortest_edge": bounds[0], "longest_edge": bounds[1]}}
            )
            out = Ernie4_5_VLMoeImageProcessorPil(**kwargs)(images=[image], return_tensors="np")
            arrays[f"{path.name}/{label}/pixel_values"] = out["pixel_values"].astype(np.float32)
            arrays[f"{path.name}/{label}/grid_thw"] = out["image_grid_thw"].astype(np.int64)
    for label, spec in PIXEL_VIDEOS.items():
        processor = Ernie4_5_VLMoeVideoProcessor(
            size={"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 30}, draw_on_frames=False
        )
        out = processor(videos=[np.stack(video_frames(spec))], return_tensors="np", do_sample_frames=False)
        arrays[f"video/{label}/pixel_values"] = out["pixel_values_videos"].astype(np.float32)
        arrays[f"video/{label}/grid_thw"] = out["video_grid_thw"].astype(np.int64)
    return arrays


def expand(case: dict[str, Any], image_out: Any, video_out: Any) -> list[int]:
    """The processor's placeholder expansion: one token per merged patch."""
    ids: list[int] = []
    grids = {tiny.IMAGE_TOKEN: iter([] if image_out is None else image_out["image_grid_thw"].tolist())}
    grids[tiny.VIDEO_TOKEN] = iter([] if video_out is None else video_out["video_grid_thw"].tolist())
    for token in case["prompt_token_ids"]:
        if token in grids:
            t, h, w = next(grids[token])
            ids.extend([token] * (t * h * w // 4 // (2 if token == tiny.VIDEO_TOKEN else 1)))
        else:
            ids.append(token)
    return ids


def model_reference(model: Any, case: dict[str, Any]) -> tuple[dict[str, Any], list[float]]:
    image_out = video_out = None
    inputs: dict[str, Any] = {}
    if case.get("images"):
        images = [Image.open(IMAGES / name) for name in case["images"]]
        image_out = Ernie4_5_VLMoeImageProcessorPil()(images=images, return_tensors="pt")
        inputs.update(pixel_values=image_out["pixel_values"], image_grid_thw=image_out["image_grid_thw"])
    if case.get("video"):
        processor = Ernie4_5_VLMoeVideoProcessor(
            size={"shortest_edge": VIDEO_BOUNDS[0], "longest_edge": VIDEO_BOUNDS[1]}, draw_on_frames=False
        )
        video_out = processor(
            videos=[np.stack(video_frames(case["video"]))], return_tensors="pt", do_sample_frames=False
        )
        inputs.update(
            pixel_values_videos=video_out["pixel_values_videos"], video_grid_thw=video_out["video_grid_thw"]
        )
    ids = expand(case, image_out, video_out)
    prompt_len = len(ids)
    steps, margins = [], []
    for _ in range(NEW_TOKENS):
        tensor = torch.tensor([ids])
        mm_types = torch.zeros_like(tensor)
        mm_types[tensor == tiny.IMAGE_TOKEN] = 1
        mm_types[tensor == tiny.VIDEO_TOKEN] = 2
        moe_types = mm_types.clone()
        moe_types[(tensor == tiny.IMAGE_START) | (tensor == tiny.IMAGE_END)] = 1
        moe_types[(tensor == tiny.VIDEO_START) | (tensor == tiny.VIDEO_END)] = 2
        model.model.rope_deltas = None
        with torch.no_grad():
            logits = (
                model(
                    input_ids=tensor,
                    mm_token_type_ids=mm_types,
                    moe_mm_token_type_ids=moe_types,
                    use_cache=False,
                    **inputs,
                )
                .logits[0, -1]
                .float()
            )
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        steps.append(rounded(logits))
        ids.append(int(torch.argmax(logits)))
    entry = {key: value for key, value in case.items()}
    entry.update(expanded_token_ids=ids[:prompt_len], output_token_ids=ids[prompt_len:], step_logits=steps)
    return entry, margins


def main() -> None:
    torch.set_num_threads(2)
    np.savez_compressed(FIXTURES / "ernie4_5_vl_pixels.npz", **pixel_fixture())
    with tempfile.TemporaryDirectory() as directory:
        tensors = tiny.write_checkpoint(directory, "pt")
        model, info = Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(
            directory, dtype=torch.float32, output_loading_info=True
        )
    problems = {key: sorted(value) for key, value in info.items() if value}
    if problems:
        sys.exit(f"transformers did not load the tiny VL checkpoint cleanly: {problems}")
    model.eval()
    cases, margins = [], []
    for case in CASES:
        entry, case_margins = model_reference(model, case)
        cases.append(entry)
        margins.extend(case_margins)
        print(
            case["name"],
            len(entry["expanded_token_ids"]),
            entry["output_token_ids"],
            round(min(case_margins), 4),
        )
    data = {
        "metadata": {
            "generator": "tools/make_vl_references.py",
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "method": "full forward passes without KV cache; greedy = argmax, no EOS stop",
            "decimals": DECIMALS,
            "video_bounds": VIDEO_BOUNDS,
        },
        "config": tiny.CONFIG,
        "seed": tiny.SEED,
        "weights_sha256": weights_checksum(tensors),
        "min_top1_top2_margin": round(min(margins), 6),
        "cases": cases,
    }
    target = FIXTURES / "ernie4_5_vl_references.json"
    target.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")
    print("wrote", target, "min margin", data["min_top1_top2_margin"])


if __name__ == "__main__":
    main()
