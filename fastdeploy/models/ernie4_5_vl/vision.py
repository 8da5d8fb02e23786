"""ERNIE-4.5-VL's vision tower and resampler, written against backend ops.

Vision tower (transformers' `Ernie4_5_VLMoeVisionTransformerPretrainedModel`): a linear patch
embedding (3*14*14 -> width, no bias), `depth` pre-LayerNorm blocks of bidirectional attention
with 2-D rotary positions (each image, or each video frame, attends only within itself) and a
quick-GELU MLP, then a final LayerNorm.

Resampler (`Ernie4_5_VLMoeVariableResolutionResamplerModel`): every 4 consecutive patch rows (one
2x2 block, in the processor's order) are concatenated and pass an MLP (fc1, exact GELU, fc2,
LayerNorm); then pairs of frames are concatenated (an image is paired with itself) and pass a
second such MLP, and a linear projection into the text width with an RMSNorm. The frame pairing
is done without a concatenation: fc1 of [a | b] is a @ W1[:, :n]^T + b @ W1[:, n:]^T + bias, and
for an image (a = b) it is a @ (W1[:, :n] + W1[:, n:])^T + bias: one product instead of two.

Each residual addition is fused into the LayerNorm that follows it (`layer_norm(..., residual=)`).
Linear weights come from `encoder_linear_weight`, so a backend may keep them in another precision
on request (the cpu backend's FD_CPU_VISION_MATMUL=bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdeploy.models.ernie4_5_vl.rotary import vision_tables
from fastdeploy.plugins.api import Backend

VISION = "model.vision_model."
RESAMPLER = "model.resampler_model."


@dataclass
class _Linear:
    weight: Any
    bias: Any | None


@dataclass
class _Block:
    norm1: tuple[Any, Any]
    norm2: tuple[Any, Any]
    qkv: _Linear
    proj: _Linear
    fc1: _Linear
    fc2: _Linear


@dataclass
class _MergeMLP:
    fc1_parts: list[Any]
    fc1_summed: Any  # the parts' weights added: fc1 of the same rows repeated in every part
    fc1_bias: Any
    fc2: _Linear
    norm: tuple[Any, Any]


class VisionEncoder:
    """Pixels of one image or video -> its rows of text-width embeddings."""

    def __init__(self, vision: dict[str, Any], text_hidden: int, text_eps: float, backend: Backend) -> None:
        self.backend = backend
        self.heads = vision["num_heads"]
        self.head_dim = vision["hidden_size"] // self.heads
        self.depth = vision["depth"]
        self.eps = vision["rms_norm_eps"]
        self.theta = vision["rope_theta"]
        self.merge = vision["spatial_merge_size"]
        self.temporal = vision["temporal_merge_size"]
        self.text_eps = text_eps
        self.text_hidden = text_hidden
        self.scale = self.head_dim**-0.5

    def tensor_names(self) -> set[str]:
        names = {VISION + "patch_embed.proj.weight", VISION + "ln.weight", VISION + "ln.bias"}
        for i in range(self.depth):
            block = f"{VISION}blocks.{i}."
            for part in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
                names.update({f"{block}{part}.weight", f"{block}{part}.bias"})
        for mlp in ("spatial_linear", "temporal_linear"):
            for index in (0, 2, 3):
                names.update({f"{RESAMPLER}{mlp}.{index}.weight", f"{RESAMPLER}{mlp}.{index}.bias"})
        names.update({RESAMPLER + "mlp.weight", RESAMPLER + "mlp.bias", RESAMPLER + "after_norm.weight"})
        return names

    def load(self, host: dict[str, Any]) -> None:
        backend = self.backend

        def linear(prefix: str) -> _Linear:
            bias = host.get(prefix + ".bias")
            return _Linear(
                backend.encoder_linear_weight(host[prefix + ".weight"]),
                None if bias is None else backend.linear_bias(bias),
            )

        def norm(prefix: str) -> tuple[Any, Any]:
            return backend.from_numpy(host[prefix + ".weight"]), backend.from_numpy(host[prefix + ".bias"])

        def merge_mlp(prefix: str, parts: int) -> _MergeMLP:
            fc1 = np.asarray(host[prefix + ".0.weight"], dtype=np.float32)
            width = fc1.shape[1] // parts
            slices = [fc1[:, i * width : (i + 1) * width] for i in range(parts)]
            return _MergeMLP(
                [backend.encoder_linear_weight(part) for part in slices],
                backend.encoder_linear_weight(np.sum(slices, axis=0)) if parts > 1 else None,
                backend.linear_bias(host[prefix + ".0.bias"]),
                linear(prefix + ".2"),
                norm(prefix + ".3"),
            )

        self.patch_embed = backend.encoder_linear_weight(host[VISION + "patch_embed.proj.weight"])
        self.blocks = [
            _Block(
                norm(f"{VISION}blocks.{i}.norm1"),
                norm(f"{VISION}blocks.{i}.norm2"),
                linear(f"{VISION}blocks.{i}.attn.qkv"),
                linear(f"{VISION}blocks.{i}.attn.proj"),
                linear(f"{VISION}blocks.{i}.mlp.fc1"),
                linear(f"{VISION}blocks.{i}.mlp.fc2"),
            )
            for i in range(self.depth)
        ]
        self.final_norm = norm(VISION + "ln")
        self.spatial = merge_mlp(RESAMPLER + "spatial_linear", 1)
        self.temporal_mlp = merge_mlp(RESAMPLER + "temporal_linear", self.temporal)
        self.projection = linear(RESAMPLER + "mlp")
        self.after_norm = backend.from_numpy(host[RESAMPLER + "after_norm.weight"])

    # --- forward ---------------------------------------------------------------------------------
    def encode(self, patches: np.ndarray, grid_thw: tuple[int, int, int]) -> Any:
        """[T*h*w, 588] pixels of one item -> [T/tm * h*w/4, text hidden] embeddings (device)."""
        ops = self.backend
        t, h, w = grid_thw
        cos, sin = vision_tables(grid_thw, self.head_dim, self.theta, self.merge)
        cos, sin = ops.from_numpy(cos), ops.from_numpy(sin)
        rows = patches.shape[0]
        cu_seqlens = np.arange(0, rows + 1, h * w, dtype=np.int64)  # one segment per frame
        x = ops.linear(ops.from_numpy(np.asarray(patches, dtype=np.float32)), self.patch_embed)
        update = None  # the last block's MLP output, added to x by the next LayerNorm
        for block in self.blocks:
            normed, x = self._add_and_norm(x, update, block.norm1)
            qkv = ops.linear(normed, block.qkv.weight, block.qkv.bias)
            attn = ops.encoder_attention_qkv(qkv, cos, sin, cu_seqlens, self.heads, self.scale)
            normed, x = self._add_and_norm(
                x, ops.linear(attn, block.proj.weight, block.proj.bias), block.norm2
            )
            update = ops.linear(
                ops.quick_gelu(ops.linear(normed, block.fc1.weight, block.fc1.bias)),
                block.fc2.weight,
                block.fc2.bias,
            )
        x, _ = self._add_and_norm(x, update, self.final_norm)
        return self.resample(x, grid_thw)

    def _add_and_norm(self, x: Any, update: Any | None, norm: tuple[Any, Any]) -> tuple[Any, Any]:
        """(LayerNorm of x + update, x + update); no addition before the first block."""
        if update is None:
            return self.backend.layer_norm(x, *norm, self.eps)
        return self.backend.layer_norm(update, *norm, self.eps, residual=x)

    def _merge_mlp(self, mlp: _MergeMLP, parts: list[Any]) -> Any:
        ops = self.backend
        if len(parts) > 1 and all(part is parts[0] for part in parts):
            hidden = ops.linear(parts[0], mlp.fc1_summed, mlp.fc1_bias)
        else:
            hidden = ops.linear(parts[0], mlp.fc1_parts[0], mlp.fc1_bias)
            for part, weight in zip(parts[1:], mlp.fc1_parts[1:], strict=True):
                hidden = hidden + ops.linear(part, weight)
        hidden = ops.gelu(hidden)
        hidden = ops.linear(hidden, mlp.fc2.weight, mlp.fc2.bias)
        out, _ = ops.layer_norm(hidden, *mlp.norm, self.eps)
        return out

    def resample(self, x: Any, grid_thw: tuple[int, int, int]) -> Any:
        ops = self.backend
        t, h, w = grid_thw
        merged_rows = x.shape[0] // (self.merge * self.merge)
        x = self._merge_mlp(self.spatial, [x.reshape(merged_rows, -1)])
        per_frame = h * w // (self.merge * self.merge)
        frames = np.arange(t * per_frame, dtype=np.int64).reshape(t, per_frame)
        if t == 1:
            parts = [x] * self.temporal
        else:
            parts = [
                ops.gather_rows(x, ops.from_numpy(frames[i :: self.temporal].reshape(-1)))
                for i in range(self.temporal)
            ]
        x = self._merge_mlp(self.temporal_mlp, parts)
        x = ops.linear(x, self.projection.weight, self.projection.bias)
        out, _ = ops.rms_norm(x, self.after_norm, self.text_eps)
        return out
