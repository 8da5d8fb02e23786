"""PaddleOCR-VL's vision encoder and projector, written against backend ops.

As transformers' `PaddleOCRVisionModel` and `PaddleOCRProjector`:

- patch embedding: a Conv2d whose kernel equals its stride (a biased linear map of each
  3 x 14 x 14 patch row), plus a learned position embedding of a square grid of
  (image_size / patch_size)^2 entries, resampled to each image's (h, w) patch grid bilinearly
  (half-pixel centres, edges clamped: `F.interpolate(mode="bilinear", align_corners=False)`);
- `num_hidden_layers` pre-LayerNorm blocks: bidirectional attention over the image with biased
  q/k/v/out projections and 2-D rotary positions (head_dim/4 frequencies, the first half of the
  rotated dimensions turning with the patch row, the second with the column, as ERNIE-4.5-VL's
  tower), then a tanh-GELU MLP; a final LayerNorm;
- projector: LayerNorm (eps 1e-5), each 2x2 block of neighbouring patches concatenated (the
  patches arrive in raster order, so the block's rows are gathered), Linear, exact GELU, Linear
  to the language model's width.

Residual additions are fused into the LayerNorm that follows them (`layer_norm(..., residual=)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.ernie4_5_vl.rotary import vision_tables
from fastdeploy.plugins.api import Backend, UnsupportedModelError

VISION = "model.visual.vision_model."
PROJECTOR = "model.projector."
#: the projector's LayerNorm epsilon (fixed in transformers' implementation)
PROJECTOR_EPS = 1e-5


@dataclass
class _Block:
    norm1: tuple[Any, Any]
    norm2: tuple[Any, Any]
    qkv: tuple[Any, Any]
    out: tuple[Any, Any]
    fc1: tuple[Any, Any]
    fc2: tuple[Any, Any]


def bilinear_matrix(out_size: int, in_size: int) -> np.ndarray:
    """[out_size, in_size] float64 weights of 1-D bilinear resampling with half-pixel centres and
    clamped edges (torch's `align_corners=False`)."""
    source = np.maximum((np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5, 0.0)
    low = np.minimum(np.floor(source).astype(np.int64), in_size - 1)
    high = np.minimum(low + 1, in_size - 1)
    frac = source - low
    weights = np.zeros((out_size, in_size))
    np.add.at(weights, (np.arange(out_size), low), 1.0 - frac)
    np.add.at(weights, (np.arange(out_size), high), frac)
    return weights


def resampled_positions(table: np.ndarray, side: int, height: int, width: int) -> np.ndarray:
    """[height * width, hidden] float32: the square position table [side * side, hidden]
    resampled to a height x width grid, in raster order."""
    hidden = table.shape[-1]
    by_rows = bilinear_matrix(height, side) @ table.reshape(side, side * hidden).astype(np.float64)
    out = np.matmul(bilinear_matrix(width, side), by_rows.reshape(height, side, hidden))
    return out.reshape(height * width, hidden).astype(np.float32)


def merge_order(grid_thw: tuple[int, int, int], merge: int) -> np.ndarray:
    """Raster patch indices regrouped so that each run of merge*merge rows is one block (row-major
    blocks, row-major inside the block), as the projector concatenates them."""
    t, h, w = grid_thw
    index = np.arange(t * h * w).reshape(t, h // merge, merge, w // merge, merge)
    return index.transpose(0, 1, 3, 2, 4).reshape(-1)


class VisionEncoder:
    """Pixels of one image -> its rows of text-width embeddings; `encode` is called once per image."""

    def __init__(self, vision: dict[str, Any], backend: Backend) -> None:
        act = vision.get("hidden_act", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise UnsupportedModelError(
                f"PaddleOCR-VL vision_config.hidden_act {act!r}: only 'gelu_pytorch_tanh' is supported"
            )
        self.backend = backend
        self.depth = int(vision["num_hidden_layers"])
        self.hidden = int(vision["hidden_size"])
        self.heads = int(vision["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.scale = self.head_dim**-0.5
        self.patch_size = int(vision["patch_size"])
        self.side = int(vision["image_size"]) // self.patch_size
        self.merge = int(vision["spatial_merge_size"])
        self.eps = float(vision["layer_norm_eps"])
        self.theta = float(vision["rope_theta"])

    def tensor_names(self) -> set[str]:
        names = {
            VISION + "embeddings.patch_embedding.weight",
            VISION + "embeddings.patch_embedding.bias",
            VISION + "embeddings.position_embedding.weight",
        }
        parts = ["post_layernorm"]
        for i in range(self.depth):
            block = f"encoder.layers.{i}."
            parts += [block + p for p in ("layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2")]
            parts += [f"{block}self_attn.{p}_proj" for p in ("q", "k", "v", "out")]
        names.update(f"{VISION}{part}.{kind}" for part in parts for kind in ("weight", "bias"))
        projector = ("pre_norm", "linear_1", "linear_2")
        names.update(f"{PROJECTOR}{part}.{kind}" for part in projector for kind in ("weight", "bias"))
        return names

    def load(self, host: dict[str, Any]) -> None:
        ops = self.backend

        def linear(*prefixes: str) -> tuple[Any, Any]:
            return (
                ops.encoder_linear_weight(*(host[p + ".weight"] for p in prefixes)),
                ops.linear_bias(*(host[p + ".bias"] for p in prefixes)),
            )

        def norm(prefix: str) -> tuple[Any, Any]:
            return ops.from_numpy(host[prefix + ".weight"]), ops.from_numpy(host[prefix + ".bias"])

        patch = np.asarray(host[VISION + "embeddings.patch_embedding.weight"], dtype=np.float32)
        self.patch_embed = (
            ops.encoder_linear_weight(patch.reshape(patch.shape[0], -1)),
            ops.linear_bias(host[VISION + "embeddings.patch_embedding.bias"]),
        )
        table = np.asarray(host[VISION + "embeddings.position_embedding.weight"], dtype=np.float32)
        if table.shape[0] != self.side * self.side:
            raise UnsupportedModelError(
                f"PaddleOCR-VL position_embedding has {table.shape[0]} rows; vision_config.image_size / "
                f"patch_size gives a {self.side}x{self.side} grid"
            )
        self.positions = table  # resampled on the host per image size
        self.blocks = []
        for i in range(self.depth):
            b = f"{VISION}encoder.layers.{i}."
            attn = b + "self_attn."
            self.blocks.append(
                _Block(
                    norm(b + "layer_norm1"),
                    norm(b + "layer_norm2"),
                    linear(attn + "q_proj", attn + "k_proj", attn + "v_proj"),
                    linear(attn + "out_proj"),
                    linear(b + "mlp.fc1"),
                    linear(b + "mlp.fc2"),
                )
            )
        self.post_norm = norm(VISION + "post_layernorm")
        self.pre_norm = norm(PROJECTOR + "pre_norm")
        self.linear_1 = linear(PROJECTOR + "linear_1")
        self.linear_2 = linear(PROJECTOR + "linear_2")

    def encode(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> Any:
        """[T*h*w, 3*14*14] pixels of one image (raster order) -> [T*h*w/4, text hidden] rows."""
        ops = self.backend
        t, h, w = grid_thw
        cos, sin = vision_tables(grid_thw, self.head_dim, self.theta, 1)
        cos, sin = ops.from_numpy(cos), ops.from_numpy(sin)
        cu_seqlens = np.arange(0, t * h * w + 1, h * w, dtype=np.int64)
        positions = np.tile(resampled_positions(self.positions, self.side, h, w), (t, 1))
        x = ops.linear(ops.from_numpy(np.asarray(patches, dtype=np.float32)), *self.patch_embed)
        x = x + ops.from_numpy(positions)
        update = None  # the last block's MLP output, added to x by the next LayerNorm
        for block in self.blocks:
            normed, x = self._add_and_norm(x, update, block.norm1, self.eps)
            attn = ops.encoder_attention_qkv(
                ops.linear(normed, *block.qkv), cos, sin, cu_seqlens, self.heads, self.scale
            )
            normed, x = self._add_and_norm(x, ops.linear(attn, *block.out), block.norm2, self.eps)
            update = ops.linear(ops.gelu_tanh(ops.linear(normed, *block.fc1)), *block.fc2)
        x, _ = self._add_and_norm(x, update, self.post_norm, self.eps)
        x, _ = ops.layer_norm(x, *self.pre_norm, PROJECTOR_EPS)
        unit = self.merge * self.merge
        x = ops.gather_rows(x, ops.from_numpy(merge_order(grid_thw, self.merge)))
        merged = x.reshape(x.shape[0] // unit, unit * self.hidden)
        return ops.linear(ops.gelu(ops.linear(merged, *self.linear_1)), *self.linear_2)

    def _add_and_norm(self, x: Any, update: Any | None, norm: tuple[Any, Any], eps: float) -> tuple[Any, Any]:
        """(LayerNorm of x + update, x + update); no addition before the first block."""
        if update is None:
            return self.backend.layer_norm(x, *norm, eps)
        return self.backend.layer_norm(update, *norm, eps, residual=x)
