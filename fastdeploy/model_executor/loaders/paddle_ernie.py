"""ERNIE-4.5 `-Paddle` checkpoints: safetensors whose tensors use PaddlePaddle's naming and layout.

Baidu publishes every ERNIE-4.5 model twice: `-PT` (transformers' names) and `-Paddle`, which
FastDeploy itself loads. The `-Paddle` tensors differ in three ways, all undone here so the
model classes see transformers' names only (the `WeightLoader` contract):

- prefix `ernie.` instead of `model.`;
- q/k/v fused into `self_attn.qkv_proj` ([q | k | v] along the output axis) and gate/up fused
  into `up_gate_proj` ([gate | up]; gate first, as FastDeploy's fused SwiGLU reads it);
- linear weights stored [in, out] (Paddle's `nn.Linear`), lm_head included; transformers
  stores [out, in]. Transposes are returned as views, so nothing is copied here.

Sharded checkpoints (`model.safetensors.index.json`) read as in `SafetensorsLoader`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.errors import WeightLoadError
from fastdeploy.model_executor.loaders.safetensors_loader import (
    SafetensorsLoader,
    read_header,
    safetensors_files,
)

PADDLE_PREFIX = "ernie."
_INDEX_FILE = "model.safetensors.index.json"


def checkpoint_tensor_names(model_dir: str) -> list[str]:
    """Tensor names of a safetensors directory, from its index or from the shards' headers."""
    index_path = os.path.join(model_dir, _INDEX_FILE)
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as handle:
                return list(json.load(handle).get("weight_map", {}))
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            raise WeightLoadError(f"cannot read {index_path}: {exc}") from exc
    names: list[str] = []
    for path in safetensors_files(model_dir):
        names.extend(read_header(path)[1])
    return names


class PaddleErnieTranslator:
    """Maps one `-Paddle` tensor to its transformers-named tensors (one, or three for qkv)."""

    def __init__(self, config: dict[str, Any]) -> None:
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        self.q_size = heads * head_dim
        self.kv_size = kv_heads * head_dim

    def translate(self, name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
        hf_name = "model." + name[len(PADDLE_PREFIX) :] if name.startswith(PADDLE_PREFIX) else name
        if hf_name.startswith("model.mtp_"):
            return [(hf_name, array)]  # multi-token-prediction heads: unused, passed on unchanged
        base, _, kind = hf_name.rpartition(".")
        if base.endswith("self_attn.qkv_proj"):
            return self._split_qkv(base[: -len("qkv_proj")], kind, array, name)
        if base.endswith("up_gate_proj"):
            return self._split_up_gate(base[: -len("up_gate_proj")], kind, array, name)
        if (
            kind == "weight"
            and array.ndim == 2
            and (base.endswith("_proj") or base.endswith(("mlp.gate", "lm_head")))
        ):
            return [(hf_name, array.T)]
        return [(hf_name, array)]

    def _split_qkv(
        self, prefix: str, kind: str, array: np.ndarray, name: str
    ) -> list[tuple[str, np.ndarray]]:
        total = self.q_size + 2 * self.kv_size
        if array.shape[-1] != total:
            raise WeightLoadError(
                f"{name} has shape {list(array.shape)}, but q+k+v of the config is {total} wide "
                f"(num_attention_heads x head_dim + 2 x num_key_value_heads x head_dim)"
            )
        bounds = (0, self.q_size, self.q_size + self.kv_size, total)
        parts = [array[..., bounds[i] : bounds[i + 1]] for i in range(3)]
        if kind == "weight":
            parts = [part.T for part in parts]
        return [(f"{prefix}{p}_proj.{kind}", part) for p, part in zip("qkv", parts, strict=True)]

    def _split_up_gate(
        self, prefix: str, kind: str, array: np.ndarray, name: str
    ) -> list[tuple[str, np.ndarray]]:
        width = array.shape[-1]
        if width % 2:
            raise WeightLoadError(f"{name} has an odd output width {width}; it must hold [gate | up]")
        gate, up = array[..., : width // 2], array[..., width // 2 :]
        if kind == "weight":
            gate, up = gate.T, up.T
        return [(f"{prefix}gate_proj.{kind}", gate), (f"{prefix}up_proj.{kind}", up)]


class PaddleErnieLoader(SafetensorsLoader):
    """Reads ERNIE-4.5 `-Paddle` safetensors directories (tensors named `ernie.*`)."""

    name = "paddle-ernie-safetensors"
    priority = 5
    reads = "an ERNIE-4.5 -Paddle directory (config.json, *.safetensors with ernie.* tensors)"

    def can_load(self, model_path: str) -> bool:
        if not super().can_load(model_path):
            return False
        try:
            names = checkpoint_tensor_names(model_path)
        except (WeightLoadError, OSError):
            return False
        return any(name.startswith(PADDLE_PREFIX) for name in names)

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray]]:
        translator = PaddleErnieTranslator(self.load_config(model_path))
        for name, array in super().load_tensors(model_path):
            yield from translator.translate(name, array)
