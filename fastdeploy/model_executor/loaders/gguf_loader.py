"""GGUF files: metadata translated to config.json terms, tensors as stored.

Quantised matrices come out as `GGMLTensor` (their blocks, dequantised with `gguf` when a backend
asks for an array), so a backend with kernels for the block format reads them as they are.

llama.cpp's converter permutes the rows of Llama's q/k projections so its interleaved rotary
kernel applies; we undo that permutation so GGUF and safetensors checkpoints share one model
code path (the rotate-half layout), as transformers does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.errors import UnsupportedModelError, WeightLoadError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.gguf_file import GGUFFile, read_gguf
from fastdeploy.model_executor.loaders.base import WeightLoader
from fastdeploy.model_executor.rope import interleaved_to_half_rows

#: GGUF `general.architecture` -> (HF architecture, whether q/k rows were permuted by the converter)
_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3ForCausalLM", False),
}

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "model.rotary_emb.freq_factors",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_tensor_name(gguf_name: str) -> str:
    """The transformers name of a GGUF tensor; unknown names raise WeightLoadError."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _LAYER_NAME.match(gguf_name)
    if match and match.group(2) in _LAYER_TENSORS:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_TENSORS[part]}.{kind}"
    raise WeightLoadError(f"GGUF tensor {gguf_name!r} has no known counterpart in the model")


class GGUFLoader(WeightLoader):
    name = "gguf"
    priority = 10
    reads = "a .gguf file"

    def can_load(self, model_path: str) -> bool:
        return model_path.lower().endswith(".gguf")

    def load_config(self, model_path: str) -> dict[str, Any]:
        return config_from_gguf(read_gguf(model_path))

    def preload(self) -> None:
        import gguf.quants  # noqa: F401  (~0.05 s: gguf, yaml, sentencepiece)

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray | GGMLTensor]]:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        gguf_file = read_gguf(model_path)
        config = config_from_gguf(gguf_file)
        permuted = _ARCHITECTURES[gguf_file.metadata["general.architecture"]][1]
        for tensor in gguf_file.tensors:
            name = hf_tensor_name(tensor.name)
            data = gguf_file.tensor_data(tensor)
            if tensor.ggml_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                array = np.asarray(data)
            elif len(tensor.shape) == 2:
                array = GGMLTensor(tensor.ggml_type, data, tuple(tensor.shape))
            else:
                array = dequantize(data, GGMLQuantizationType(tensor.ggml_type))
            if permuted and name.endswith("self_attn.q_proj.weight"):
                array = interleaved_to_half_rows(array, config["num_attention_heads"])
            elif permuted and name.endswith("self_attn.k_proj.weight"):
                array = interleaved_to_half_rows(array, config["num_key_value_heads"])
            yield name, array


def config_from_gguf(gguf_file: GGUFFile) -> dict[str, Any]:
    """A config.json-style dict from a GGUF file's metadata and tensor table."""
    meta = gguf_file.metadata
    config = config_from_metadata(meta)
    config["tie_word_embeddings"] = all(tensor.name != "output.weight" for tensor in gguf_file.tensors)
    if not config.get("vocab_size"):
        config["vocab_size"] = len(meta.get("tokenizer.ggml.tokens", ()))
    return config


def config_from_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """A config.json-style dict from GGUF key/values (tensor-dependent fields aside)."""
    arch = meta.get("general.architecture")
    if arch not in _ARCHITECTURES:
        known = ", ".join(sorted(_ARCHITECTURES))
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported (supported: {known})")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    head_dim = int(key("attention.key_length") or key("rope.dimension_count") or hidden // heads)
    config: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[arch][0]],
        "hidden_size": hidden,
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv") or heads),
        "head_dim": head_dim,
        "intermediate_size": int(key("feed_forward_length")),
        "max_position_embeddings": int(key("context_length", 2048)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "vocab_size": int(key("vocab_size") or 0),
    }
    scaling_type = key("rope.scaling.type")
    if scaling_type in ("linear", "yarn"):
        config["rope_scaling"] = {
            "rope_type": scaling_type,
            "factor": float(key("rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(key("rope.scaling.original_context_length", 0) or 0),
        }
    return config
