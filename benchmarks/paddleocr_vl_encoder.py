"""PaddleOCR-VL's vision encoder and projector at the real shape (27 blocks of width 1152, 16 heads,
a 27x27 position grid) on one image: fastdeploy's cpu backend against transformers' float32
`get_image_features`, alternating in the same run, random weights.

Prints the output's max relative error (max |a - b| / max |b|), each side's best time and the
ratio (transformers' time over fastdeploy's), with the load average.

    python benchmarks/paddleocr_vl_encoder.py [--size 448] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embeddings import best_seconds  # noqa: E402  (benchmarks/ is the script directory)

from fastdeploy.backends.cpu.backend import CpuBackend  # noqa: E402
from fastdeploy.model_executor.loaders.paddleocr_vl import PaddleOCRVLLoader  # noqa: E402
from fastdeploy.models.paddleocr_vl.vision import VisionEncoder  # noqa: E402
from fastdeploy.plugins.api import BackendOptions  # noqa: E402

#: a one-layer language model: only its width (the projector's output) matters here
TEXT = {
    "vocab_size": 1000,
    "hidden_size": 1024,
    "intermediate_size": 256,
    "num_hidden_layers": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [16, 24, 24]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=448, help="square image side in pixels")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    config = transformers.PaddleOCRVLConfig(text_config=TEXT, vision_config={})
    model = transformers.PaddleOCRVLForConditionalGeneration(config).float().eval()
    pixels = args.size * args.size
    image = Image.fromarray(
        np.random.default_rng(0).integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)
    )
    inputs = PaddleOCRVLImageProcessorPil(min_pixels=pixels, max_pixels=pixels)(
        images=[image], return_tensors="np"
    )
    patches, grids = inputs["pixel_values"], inputs["image_grid_thw"]
    grid = tuple(int(x) for x in grids[0])

    vision = {**PaddleOCRVLLoader.vision_defaults, **config.vision_config.to_dict(), "rope_theta": 10000.0}
    encoder = VisionEncoder(vision, CpuBackend(BackendOptions(threads=args.threads)))
    encoder.load({name: tensor.numpy() for name, tensor in model.state_dict().items()})
    rows = patches.reshape(patches.shape[0], -1)

    def ours() -> np.ndarray:
        return np.asarray(encoder.encode(rows, grid))

    def theirs() -> np.ndarray:
        with torch.no_grad():
            features = model.model.get_image_features(torch.from_numpy(patches), torch.from_numpy(grids))
        return torch.cat(features.pooler_output).numpy()

    reference = theirs()
    error = float(np.abs(ours() - reference).max() / np.abs(reference).max())
    best = best_seconds({"fastdeploy": ours, "transformers": theirs}, args.repeats)
    load = "/".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"grid {grid} ({reference.shape[0]} tokens), {args.threads} threads: max rel error {error:.1e}; "
        f"fastdeploy {best['fastdeploy'] * 1000:.0f} ms, transformers {best['transformers'] * 1000:.0f} ms, "
        f"ratio {best['transformers'] / best['fastdeploy']:.2f}x (load average {load})"
    )


if __name__ == "__main__":
    main()
