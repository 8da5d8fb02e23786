"""ERNIE-4.5 `-Paddle` checkpoints: safetensors whose tensors use PaddlePaddle's naming and layout.

Baidu publishes every ERNIE-4.5 model twice: `-PT` (transformers' names) and `-Paddle`, which
FastDeploy itself loads. The `-Paddle` tensors differ in three ways, all undone here so the
model classes see transformers' names only (the `WeightLoader` contract):

- prefix `ernie.` instead of `model.`;
- q/k/v fused into `self_attn.qkv_proj` ([q | k | v] along the output axis) and gate/up fused
  into `up_gate_proj` ([gate | up]; gate first, as FastDeploy's fused SwiGLU reads it);
- linear weights stored [in, out] (Paddle's `nn.Linear`), lm_head included; transformers
  stores [out, in]. Transposes are returned as views, so nothing is copied here.

Pre-quantised checkpoints (config.json's `quantization_config`: `"quantization": "wint8"` or
`"wint4"`, or `"mix_quant"` with `dense_quant_type` / `moe_quant_type`) store each quantised
linear weight as `X.quant_weight` + `X.weight_scale` in Paddle's CUTLASS layout; they are read
into `WeightOnlyTensor`s ([out, in], `formats/paddle_weight_only.py`) and split like the float
ones, so the model receives packed weights and nothing is dequantised.

Sharded checkpoints (`model.safetensors.index.json`) read as in `SafetensorsLoader`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.errors import WeightLoadError
from fastdeploy.formats.paddle_weight_only import paddle_weight_only
from fastdeploy.formats.weight_only import WeightOnlyTensor
from fastdeploy.model_executor.loaders.safetensors_loader import (
    SafetensorsLoader,
    read_header,
    safetensors_files,
)

PADDLE_PREFIX = "ernie."
_INDEX_FILE = "model.safetensors.index.json"
#: the pre-quantised weight kinds read (FastDeploy's names)
PREQUANTISED_KINDS = ("wint8", "wint4")


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
            and not isinstance(array, WeightOnlyTensor)  # already [out, in]
            and (base.endswith("_proj") or base.endswith(("mlp.gate", "lm_head")))
        ):
            return [(hf_name, array.T)]
        return [(hf_name, array)]

    def _split_qkv(
        self, prefix: str, kind: str, array: np.ndarray, name: str
    ) -> list[tuple[str, np.ndarray]]:
        total = self.q_size + 2 * self.kv_size
        if _output_width(array) != total:
            raise WeightLoadError(
                f"{name} has shape {list(array.shape)}, but q+k+v of the config is {total} wide "
                f"(num_attention_heads x head_dim + 2 x num_key_value_heads x head_dim)"
            )
        bounds = (0, self.q_size, self.q_size + self.kv_size, total)
        parts = _split_outputs(array, kind, bounds)
        return [(f"{prefix}{p}_proj.{kind}", part) for p, part in zip("qkv", parts, strict=True)]

    def _split_up_gate(
        self, prefix: str, kind: str, array: np.ndarray, name: str
    ) -> list[tuple[str, np.ndarray]]:
        width = _output_width(array)
        if width % 2:
            raise WeightLoadError(f"{name} has an odd output width {width}; it must hold [gate | up]")
        gate, up = _split_outputs(array, kind, (0, width // 2, width))
        return [(f"{prefix}gate_proj.{kind}", gate), (f"{prefix}up_proj.{kind}", up)]


def _output_width(array: Any) -> int:
    """The output width of a fused -Paddle tensor: [in, out] arrays, [out, in] packed weights."""
    return array.shape[0] if isinstance(array, WeightOnlyTensor) else array.shape[-1]


def _split_outputs(array: Any, kind: str, bounds: tuple[int, ...]) -> list[Any]:
    """A fused tensor cut along its outputs at `bounds`, weights as transformers' [out, in]."""
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    if isinstance(array, WeightOnlyTensor):
        return [array.take_rows(np.arange(start, stop)) for start, stop in spans]
    parts = [array[..., start:stop] for start, stop in spans]
    return [part.T for part in parts] if kind == "weight" else parts


def prequantised_kinds(config: dict[str, Any], source: str) -> tuple[str, str] | None:
    """(dense kind, expert kind) of a pre-quantised -Paddle checkpoint, or None for a float one.
    FastDeploy's `quantization_config` names one kind for every linear weight, or `mix_quant`
    with `dense_quant_type` and `moe_quant_type`."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("is_quantized") is False:
        return None
    name = quant.get("quantization")
    kinds = (
        (quant.get("dense_quant_type"), quant.get("moe_quant_type")) if name == "mix_quant" else (name, name)
    )
    bad = [kind for kind in kinds if kind not in PREQUANTISED_KINDS]
    if bad:
        raise WeightLoadError(
            f"{source}: quantization_config declares {bad[0]!r} weights; pre-quantised -Paddle checkpoints "
            f"are read in {', '.join(PREQUANTISED_KINDS)} (a float checkpoint with quantization= quantises "
            "at load instead)"
        )
    return kinds[0], kinds[1]


def pair_quant_weights(
    tensors: Iterator[tuple[str, Any]], kinds: tuple[str, str], source: str
) -> Iterator[tuple[str, Any]]:
    """Each `X.quant_weight` with its `X.weight_scale` as one `WeightOnlyTensor` under `X.weight`
    (experts in the expert kind, the rest in the dense kind); other tensors pass unchanged."""
    pending: dict[str, tuple[str, Any]] = {}
    for name, tensor in tensors:
        if name.endswith(".quant_weight"):
            base = name[: -len(".quant_weight")]
        elif name.endswith(".weight_scale"):
            base = name[: -len(".weight_scale")]
        else:
            yield name, tensor
            continue
        if base not in pending:
            pending[base] = (name, tensor)
            continue
        other_name, other = pending.pop(base)
        weight, scale = (tensor, other) if name.endswith(".quant_weight") else (other, tensor)
        kind = kinds[1] if ".experts." in base else kinds[0]
        yield base + ".weight", paddle_weight_only(np.asarray(weight), np.asarray(scale), kind, base)
    if pending:
        raise WeightLoadError(
            f"{source}: {', '.join(sorted(n for n, _ in pending.values())[:4])} without its "
            "quant_weight / weight_scale partner"
        )


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
        config = self.load_config(model_path)
        translator = PaddleErnieTranslator(config)
        tensors = super().load_tensors(model_path)
        kinds = prequantised_kinds(config, model_path)
        if kinds is not None:
            tensors = pair_quant_weights(tensors, kinds, model_path)
        for name, array in tensors:
            yield from translator.translate(name, array)
