"""Reading a LoRA adapter from its files into one form, whatever the format.

PEFT directories (`adapter_config.json` + `adapter_model.safetensors`) are read here; GGUF LoRA
files in `gguf_adapter.py`. What is read is checked against the model by `LoRAManager`.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.model_executor.loaders.safetensors_loader import mapped_tensors
from fastdeploy.model_executor.lora.request import LoRARequest

#: a PEFT tensor name: the decoder layer, the linear layer, A or B
_PEFT_TENSOR = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$"
)


@dataclass
class LoRAWeights:
    """An adapter as read: per (layer, module name) its A [rank, in], B [out, rank] (float32,
    the rows in the checkpoint's layout) and scale (alpha / rank, or alpha / sqrt(rank))."""

    request: LoRARequest
    modules: dict[tuple[int, str], tuple[np.ndarray, np.ndarray, float]] = field(default_factory=dict)
    #: the module names the adapter's config says it targets (for error messages)
    targets: tuple[str, ...] = ()
    #: the base model it was trained on, as its files say (for error messages)
    base_model: str | None = None
    #: B's q/k rows are in llama.cpp's interleaved rotary layout (GGUF files of Llama)
    interleaved_qk: bool = False

    @property
    def rank(self) -> int:
        return max((a.shape[0] for a, _, _ in self.modules.values()), default=0)

    def refuse(self, why: str) -> InvalidArgumentError:
        """The error for this adapter, naming it and its path."""
        request = self.request
        return InvalidArgumentError(f"LoRA adapter {request.lora_name!r} ({request.lora_path}): {why}")


def _pattern_value(pattern: dict[str, Any], module: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern: the value of the first key matching the module's
    full name (a key matches a name or its dotted suffix, as a regular expression)."""
    for key, value in pattern.items():
        if re.fullmatch(rf"(.*\.)?{key}", module):
            return value
    return default


def read_peft(request: LoRARequest) -> LoRAWeights:
    """A PEFT LoRA directory; refuses what the engine would compute differently from PEFT."""
    path = request.lora_path
    weights = LoRAWeights(request)
    config_path = os.path.join(path, "adapter_config.json")
    tensors_path = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(config_path):
        raise weights.refuse(
            "no adapter_config.json there (expected a PEFT adapter directory or a .gguf file)"
        )
    if not os.path.isfile(tensors_path):
        raise weights.refuse("no adapter_model.safetensors there (PEFT's .bin format is not read)")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise weights.refuse(f"adapter_config.json is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise weights.refuse("adapter_config.json must hold a JSON object")
    unsupported = [
        f"{key}={config[key]!r}"
        for key, fine in (("peft_type", "LORA"), ("bias", "none"))
        if config.get(key, fine) != fine
    ]
    unsupported += [
        f"{key}={config[key]!r}"
        for key in (
            "use_dora",
            "fan_in_fan_out",
            "modules_to_save",
            "lora_bias",
            "layer_replication",
            "target_parameters",
        )
        if config.get(key)
    ]
    if unsupported:
        raise weights.refuse(f"{', '.join(unsupported)} is not supported (plain LoRA on linear layers only)")
    targets = config.get("target_modules") or ()
    weights.targets = (targets,) if isinstance(targets, str) else tuple(targets)
    weights.base_model = config.get("base_model_name_or_path")
    alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    alpha_pattern = config.get("alpha_pattern") or {}
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    groups: dict[str, str] = {}
    for name, tensor in mapped_tensors(tensors_path):
        match = _PEFT_TENSOR.match(name)
        if match is None:
            raise weights.refuse(
                f"tensor {name} is not LoRA A/B of a decoder layer's linear layer (adapters on embeddings, "
                "the LM head or other modules are not supported)"
            )
        layer, module, which = int(match[1]), match[3], match[4]
        groups[module] = match[2]
        pairs.setdefault((layer, module), {})[which] = np.asarray(tensor, dtype=np.float32)
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise weights.refuse(f"layers.{layer}.{module} has lora_{''.join(pair)} without its pair")
        rank = pair["A"].shape[0]
        full_name = f"model.layers.{layer}.{groups[module]}.{module}"
        module_alpha = float(_pattern_value(alpha_pattern, full_name, alpha))
        scale = module_alpha / (math.sqrt(rank) if rslora else rank)
        weights.modules[(layer, module)] = (pair["A"], pair["B"], scale)
    if not weights.modules:
        raise weights.refuse("adapter_model.safetensors holds no LoRA weights")
    return weights
