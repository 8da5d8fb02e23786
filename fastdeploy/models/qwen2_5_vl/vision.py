"""Qwen2.5-VL's vision tower, written against backend ops.

As transformers' `Qwen2_5_VisionTransformerPretrainedModel`: a 3-D patch embedding (a Conv3d
whose kernel equals its stride, i.e. a linear map of each 3 x 2 x 14 x 14 row, no bias), `depth`
pre-RMSNorm blocks (bidirectional attention with a fused biased qkv and 2-D rotary positions,
then a biased SwiGLU MLP), and the patch merger (RMSNorm, 2x2 neighbouring patches concatenated,
Linear-GELU-Linear to the language model's width).

Window attention: the blocks listed in `fullatt_block_indexes` attend over the whole image; the
others only within windows of `window_size` pixels (8x8 patches, 4x4 merge blocks; windows at
the right and bottom edges are smaller). The patch rows are reordered window by window before
the blocks (so each window is one `encoder_attention` segment) and the merger's rows are put
back in the processor's order after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.ernie4_5_vl.rotary import vision_tables
from fastdeploy.plugins.api import Backend, UnsupportedModelError

#: RMSNorm epsilon of the vision blocks and the merger (fixed in transformers' implementation)
VISION_EPS = 1e-6


@dataclass
class _Block:
    norm1: Any
    norm2: Any
    qkv: tuple[Any, Any]
    proj: tuple[Any, Any]
    gate_up: tuple[Any, Any]
    down: tuple[Any, Any]


def window_layout(
    grid_thw: tuple[int, int, int], merge: int, window_size: int, patch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(merge-block order, cu_seqlens in patch rows) of window attention for one item.

    Merge blocks (rows of merge*merge patches) are regrouped window by window, each window a
    square of window_size / patch_size / merge blocks, clipped at the right and bottom edges.
    """
    t, h, w = grid_thw
    blocks_h, blocks_w = h // merge, w // merge
    side = window_size // merge // patch_size
    unit = merge * merge
    order: list[np.ndarray] = []
    lengths: list[int] = []
    index = np.arange(t * blocks_h * blocks_w).reshape(t, blocks_h, blocks_w)
    for frame in range(t):
        for top in range(0, blocks_h, side):
            for left in range(0, blocks_w, side):
                window = index[frame, top : top + side, left : left + side].reshape(-1)
                order.append(window)
                lengths.append(window.size * unit)
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.concatenate(order), cu_seqlens


class VisionTower:
    """Weights and forward pass of the vision tower; `encode` is called once per image."""

    def __init__(self, vision: dict[str, Any], backend: Backend) -> None:
        act = vision.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(
                f"Qwen2.5-VL vision_config.hidden_act {act!r}: only 'silu' is supported"
            )
        self.backend = backend
        self.depth = int(vision["depth"])
        self.hidden = int(vision["hidden_size"])
        self.heads = int(vision["num_heads"])
        self.head_dim = self.hidden // self.heads
        self.scale = self.head_dim**-0.5
        self.patch_size = int(vision["patch_size"])
        self.merge = int(vision["spatial_merge_size"])
        self.window_size = int(vision["window_size"])
        self.full_attention = {int(i) for i in vision["fullatt_block_indexes"]}
        self.theta = float(vision["rope_theta"])
        self.prefix = "model.visual."

    def tensor_names(self) -> set[str]:
        p = self.prefix
        names = {p + "patch_embed.proj.weight", p + "merger.ln_q.weight"}
        for index in (0, 2):
            names.update({f"{p}merger.mlp.{index}.weight", f"{p}merger.mlp.{index}.bias"})
        for i in range(self.depth):
            block = f"{p}blocks.{i}."
            names.update({block + "norm1.weight", block + "norm2.weight"})
            for part in ("attn.qkv", "attn.proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                names.update({f"{block}{part}.weight", f"{block}{part}.bias"})
        return names

    def load(self, host: dict[str, Any]) -> None:
        ops, p = self.backend, self.prefix

        def linear(*names: str) -> tuple[Any, Any]:
            return (
                ops.encoder_linear_weight(*(host[name + ".weight"] for name in names)),
                ops.linear_bias(*(host[name + ".bias"] for name in names)),
            )

        patch = np.asarray(host[p + "patch_embed.proj.weight"], dtype=np.float32)
        self.patch_embed = ops.encoder_linear_weight(patch.reshape(patch.shape[0], -1))
        self.blocks = []
        for i in range(self.depth):
            b = f"{p}blocks.{i}."
            self.blocks.append(
                _Block(
                    ops.from_numpy(host[b + "norm1.weight"]),
                    ops.from_numpy(host[b + "norm2.weight"]),
                    linear(b + "attn.qkv"),
                    linear(b + "attn.proj"),
                    linear(b + "mlp.gate_proj", b + "mlp.up_proj"),
                    linear(b + "mlp.down_proj"),
                )
            )
        self.merger_norm = ops.from_numpy(host[p + "merger.ln_q.weight"])
        self.merger_fc1 = linear(p + "merger.mlp.0")
        self.merger_fc2 = linear(p + "merger.mlp.2")

    def encode(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> Any:
        """[T*h*w, 3*2*14*14] pixels of one image -> [T*h*w/4, text hidden] embeddings (device)."""
        ops = self.backend
        t, h, w = grid_thw
        unit = self.merge * self.merge
        order, window_seqlens = window_layout(grid_thw, self.merge, self.window_size, self.patch_size)
        rows = (order[:, None] * unit + np.arange(unit)).reshape(-1)
        cos, sin = vision_tables(grid_thw, self.head_dim, self.theta, self.merge)
        cos, sin = ops.from_numpy(cos[rows]), ops.from_numpy(sin[rows])
        full_seqlens = np.arange(0, t * h * w + 1, h * w, dtype=np.int64)
        x = ops.linear(ops.from_numpy(np.asarray(patches, dtype=np.float32)[rows]), self.patch_embed)
        update = None  # the last block's MLP output, added to x by the next RMSNorm
        for i, block in enumerate(self.blocks):
            normed, x = self._add_and_norm(x, update, block.norm1)
            seqlens = full_seqlens if i in self.full_attention else window_seqlens
            attn = ops.encoder_attention_qkv(
                ops.linear(normed, *block.qkv), cos, sin, seqlens, self.heads, self.scale
            )
            normed, x = self._add_and_norm(x, ops.linear(attn, *block.proj), block.norm2)
            update = ops.linear(ops.silu_and_mul(ops.linear(normed, *block.gate_up)), *block.down)
        normed, _ = self._add_and_norm(x, update, self.merger_norm)
        merged = normed.reshape(normed.shape[0] // unit, unit * self.hidden)
        merged = ops.linear(ops.gelu(ops.linear(merged, *self.merger_fc1)), *self.merger_fc2)
        return ops.gather_rows(merged, ops.from_numpy(np.argsort(order)))

    def _add_and_norm(self, x: Any, update: Any | None, weight: Any) -> tuple[Any, Any]:
        """(RMSNorm of x + update, x + update); no addition before the first block."""
        if update is None:
            return self.backend.rms_norm(x, weight, VISION_EPS)
        return self.backend.rms_norm(update, weight, VISION_EPS, residual=x)
