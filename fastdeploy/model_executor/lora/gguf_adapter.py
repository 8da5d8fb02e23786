"""Reading an adapter by its format (`read_adapter`), and llama.cpp's GGUF LoRA files (written
by its `convert_lora_to_gguf.py`) as `LoRAWeights`.

Tensors are `blk.N.<tensor>.weight.lora_a` [rank, in] and `.lora_b` [out, rank] under llama.cpp's
names, the scale is `adapter.lora.alpha` / rank (1 when alpha is 0, as llama.cpp does). For
architectures whose converter interleaves q/k rows for rotary (Llama), B's q/k rows come
interleaved; the manager puts them back with the model's head counts.
"""

from __future__ import annotations

import os
import re

import numpy as np

from fastdeploy.errors import FastDeployError, WeightLoadError
from fastdeploy.formats.ggml_types import F16, F32, dequantize_reference
from fastdeploy.formats.gguf_file import read_gguf
from fastdeploy.model_executor.loaders.gguf_loader import architecture_permutes_qk, hf_tensor_name
from fastdeploy.model_executor.lora.adapter import LoRAWeights, read_peft
from fastdeploy.model_executor.lora.request import LoRARequest

_LORA_TENSOR = re.compile(r"^(blk\.\d+\.\w+\.weight)\.lora_([ab])$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.weight$")


def _hf_name(gguf_name: str, arch: str) -> str:
    """The transformers name of a base tensor a LoRA pair belongs to ("" when unknown)."""
    try:
        return hf_tensor_name(gguf_name, arch)
    except WeightLoadError:
        return ""


def read_gguf_lora(request: LoRARequest) -> LoRAWeights:
    weights = LoRAWeights(request)
    try:
        gguf_file = read_gguf(request.lora_path)
    except FastDeployError as exc:
        raise weights.refuse(f"not a readable GGUF file: {exc}") from exc
    meta = gguf_file.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise weights.refuse(
            f"a GGUF file but not a LoRA adapter (general.type={meta.get('general.type')!r}, "
            f"adapter.type={meta.get('adapter.type')!r})"
        )
    arch = meta.get("general.architecture", "llama")
    weights.base_model = meta.get("general.base_model.0.name") or arch
    weights.interleaved_qk = architecture_permutes_qk(arch)
    alpha = float(meta.get("adapter.lora.alpha", 0.0))
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for tensor in gguf_file.tensors:
        match = _LORA_TENSOR.match(tensor.name)
        hf = _HF_LAYER.match(_hf_name(match[1], arch)) if match else None
        if hf is None:
            raise weights.refuse(
                f"tensor {tensor.name} is not LoRA a/b of a decoder layer's linear layer (adapters on "
                "embeddings, the LM head or other modules are not supported)"
            )
        data = gguf_file.tensor_data(tensor)
        if tensor.ggml_type not in (F32, F16):
            data = dequantize_reference(data, tensor.ggml_type)
        pairs.setdefault((int(hf[1]), hf[2]), {})[match[2]] = np.asarray(data, dtype=np.float32)
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"a", "b"}:
            raise weights.refuse(f"layer {layer}'s {module} has lora_{''.join(pair)} without its pair")
        rank = pair["a"].shape[0]
        weights.modules[(layer, module)] = (pair["a"], pair["b"], alpha / rank if alpha else 1.0)
    weights.targets = tuple(sorted({module for _, module in weights.modules}))
    if not weights.modules:
        raise weights.refuse("the GGUF file holds no LoRA tensors")
    return weights


def read_adapter(request: LoRARequest) -> LoRAWeights:
    """The adapter at `request.lora_path`: a .gguf file (llama.cpp) or a PEFT directory."""
    path = request.lora_path
    if os.path.isfile(path) and path.endswith(".gguf"):
        return read_gguf_lora(request)
    if not os.path.isdir(path):
        raise LoRAWeights(request).refuse("no such directory or .gguf file")
    return read_peft(request)
