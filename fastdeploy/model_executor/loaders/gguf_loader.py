"""GGUF files: metadata translated to config.json terms, tensors as stored.

Quantised matrices come out as `GGMLTensor` (their blocks, dequantised with `gguf` when a backend
asks for an array), so a backend with kernels for the block format reads them as they are.

llama.cpp's converter permutes the rows of Llama's q/k projections so its interleaved rotary
kernel applies; we undo that permutation so GGUF and safetensors checkpoints share one model
code path (the rotate-half layout), as transformers does.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.errors import UnsupportedModelError, WeightLoadError
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.ggml_types import F16, F32, dequantize_reference
from fastdeploy.formats.gguf_file import GGUFFile, read_gguf
from fastdeploy.model_executor.loaders.base import WeightLoader
from fastdeploy.model_executor.rope import interleaved_to_half_rows

#: GGUF `general.architecture` -> (HF architecture, whether q/k rows were permuted by the converter)
_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3ForCausalLM", False),
    "phi3": ("Phi3ForCausalLM", False),
    "qwen2moe": ("Qwen2MoeForCausalLM", False),
    "qwen3moe": ("Qwen3MoeForCausalLM", False),
    # ERNIE's q/k rows are interleaved in transformers too; the model class reorders them
    "ernie4_5": ("Ernie4_5ForCausalLM", False),
    "ernie4_5-moe": ("Ernie4_5_MoeForCausalLM", False),
    "gemma2": ("Gemma2ForCausalLM", False),
    "gemma3": ("Gemma3ForCausalLM", False),
}
#: architectures whose converter stores RMSNorm weights as the scale (1 + w) where transformers
#: stores w
_NORMS_PLUS_ONE = {"gemma2", "gemma3"}
#: llama.cpp writes Mixtral as "llama" with experts
_LLAMA_WITH_EXPERTS = "MixtralForCausalLM"

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "model.rotary_emb.freq_factors",
}
#: LongRoPE factors, which config_from_gguf puts in `rope_scaling` as config.json has them
_ROPE_FACTORS = {"rope_factors_long.weight": "long_factor", "rope_factors_short.weight": "short_factor"}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
}
#: Gemma 2 and 3's four norms a layer
_GEMMA_LAYER_TENSORS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
#: where an architecture's names differ from _LAYER_TENSORS (full names for a part stored as
#: ".bias" whose HF name is not "<stem>.bias")
_ARCH_LAYER_TENSORS: dict[str, dict[str, str]] = {
    # Phi-3 stores gate and up fused, [gate | up] rows, under llama.cpp's ffn_up
    "phi3": {"ffn_up": "mlp.gate_up_proj"},
    "llama": {"ffn_gate_inp": "block_sparse_moe.gate"},
    "qwen2moe": {
        "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
        "ffn_up_shexp": "mlp.shared_expert.up_proj",
        "ffn_down_shexp": "mlp.shared_expert.down_proj",
        "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    },
    "gemma3": _GEMMA_LAYER_TENSORS,
    "gemma2": _GEMMA_LAYER_TENSORS,
    "ernie4_5-moe": {
        "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
        "ffn_up_shexp": "mlp.shared_experts.up_proj",
        "ffn_down_shexp": "mlp.shared_experts.down_proj",
    },
}
_FULL_LAYER_NAMES = {"exp_probs_b.bias": "mlp.moe_statics.e_score_correction_bias"}
#: llama.cpp stacks a layer's experts into one [experts, out, in] tensor per projection; the
#: HF names of expert N's projection, per architecture ({} is the expert number)
_EXPERT_TENSORS = {"ffn_gate_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}
_EXPERT_NAMES = {
    "llama": (
        "block_sparse_moe.experts.{}.w1",
        "block_sparse_moe.experts.{}.w3",
        "block_sparse_moe.experts.{}.w2",
    ),
}
_DEFAULT_EXPERT_NAMES = ("mlp.experts.{}.gate_proj", "mlp.experts.{}.up_proj", "mlp.experts.{}.down_proj")
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def architecture_permutes_qk(arch: str) -> bool:
    """Whether llama.cpp's converter interleaves the q/k rows of architecture `arch` for rotary
    (the loader puts them back with `interleaved_to_half_rows`)."""
    return _ARCHITECTURES.get(arch, ("", False))[1]


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str:
    """The transformers name of a GGUF tensor of architecture `arch` (one tensor: stacked
    experts are named by `expert_tensor_names`); unknown names raise WeightLoadError."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _LAYER_NAME.match(gguf_name)
    if match:
        layer, part, kind = match.groups()
        if f"{part}.{kind}" in _FULL_LAYER_NAMES:
            return f"model.layers.{layer}.{_FULL_LAYER_NAMES[f'{part}.{kind}']}"
        stem = _ARCH_LAYER_TENSORS.get(arch, {}).get(part) or _LAYER_TENSORS.get(part)
        if stem is not None:
            return f"model.layers.{layer}.{stem}.{kind}"
    raise WeightLoadError(f"GGUF tensor {gguf_name!r} has no known counterpart in the model")


def expert_tensor_names(gguf_name: str, arch: str, experts: int) -> list[str]:
    """The transformers names of the `experts` matrices stacked in 3-D GGUF tensor `gguf_name`."""
    match = _LAYER_NAME.match(gguf_name)
    if not match or match.group(2) not in _EXPERT_TENSORS or match.group(3) != "weight":
        raise WeightLoadError(f"GGUF tensor {gguf_name!r} is 3-D but not a known stack of experts")
    pattern = _EXPERT_NAMES.get(arch, _DEFAULT_EXPERT_NAMES)[_EXPERT_TENSORS[match.group(2)]]
    return [f"model.layers.{match.group(1)}.{pattern.format(e)}.weight" for e in range(experts)]


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
        gguf_file = read_gguf(model_path)
        config = config_from_gguf(gguf_file)
        arch = gguf_file.metadata["general.architecture"]
        permuted = _ARCHITECTURES[arch][1]
        identities = {}
        for tensor in gguf_file.tensors:
            if tensor.name in _ROPE_FACTORS:
                continue  # in config["rope_scaling"]
            data = gguf_file.tensor_data(tensor)
            is_float = tensor.ggml_type in (F32, F16)
            source = tensor.path or gguf_file.path
            if source not in identities:
                identities[source] = file_identity(source)
            origin = f"{identities[source]}|{tensor.name}"
            if len(tensor.shape) == 3:
                # one [out, in] matrix per expert, quantised ones still in their blocks
                experts = expert_tensor_names(tensor.name, arch, tensor.shape[0])
                for index, (name, rows) in enumerate(zip(experts, data, strict=True)):
                    yield (
                        name,
                        np.asarray(rows)
                        if is_float
                        else GGMLTensor(tensor.ggml_type, rows, tensor.shape[1:], f"{origin}|expert {index}"),
                    )
                continue
            name = hf_tensor_name(tensor.name, arch)
            if is_float:
                array = np.asarray(data)
            elif len(tensor.shape) == 2:
                array = GGMLTensor(tensor.ggml_type, data, tuple(tensor.shape), origin)
            else:  # a quantised vector (llama.cpp writes them in F32)
                array = dequantize_reference(data, tensor.ggml_type)
            if arch in _NORMS_PLUS_ONE and name.endswith("norm.weight"):
                array = np.asarray(array, dtype=np.float32) - np.float32(1.0)
            if permuted and name.endswith("self_attn.q_proj.weight"):
                array = interleaved_to_half_rows(array, config["num_attention_heads"])
            elif permuted and name.endswith("self_attn.k_proj.weight"):
                array = interleaved_to_half_rows(array, config["num_key_value_heads"])
            yield name, array

    def shape_error(
        self, model_path: str, wrong: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    ) -> str | None:
        """Each tensor named as the GGUF file has it, with the shape its metadata implies."""
        gguf_file = read_gguf(model_path)
        arch = gguf_file.metadata["general.architecture"]
        where: dict[str, str] = {}
        for tensor in gguf_file.tensors:
            if len(tensor.shape) == 3 and _LAYER_NAME.match(tensor.name):
                for index, name in enumerate(expert_tensor_names(tensor.name, arch, tensor.shape[0])):
                    where[name] = f"{tensor.name!r} (expert {index})"
            elif tensor.name not in _ROPE_FACTORS:
                with contextlib.suppress(WeightLoadError):
                    where[hf_tensor_name(tensor.name, arch)] = repr(tensor.name)
        described = [
            f"tensor {where.get(name, repr(name))} has shape {shape}, expected {want}"
            for name, shape, want in wrong[:4]
        ]
        more = f" (and {len(wrong) - 4} more)" if len(wrong) > 4 else ""
        return (
            f"{gguf_file.path}: tensors disagree with the file's {arch} metadata: "
            + "; ".join(described)
            + more
        )


def file_identity(path: str) -> str:
    """The file's absolute path, size and modification time: what a `GGMLTensor.origin` names, so
    a cache of what is derived from its blocks misses once the file is replaced."""
    status = os.stat(path)
    return f"{os.path.abspath(path)}|{status.st_size}|{status.st_mtime_ns}"


def config_from_gguf(gguf_file: GGUFFile) -> dict[str, Any]:
    """A config.json-style dict from a GGUF file's metadata and tensor table."""
    meta = gguf_file.metadata
    if meta.get("general.architecture") not in _ARCHITECTURES:
        raise UnsupportedModelError(f"{gguf_file.path}: {unsupported_architecture(meta)}")
    config = config_from_metadata(meta)
    names = {tensor.name for tensor in gguf_file.tensors}
    config["tie_word_embeddings"] = "output.weight" not in names
    if not config.get("vocab_size"):
        config["vocab_size"] = len(meta.get("tokenizer.ggml.tokens", ()))
    arch = meta["general.architecture"]
    has_bias = "blk.0.attn_q.bias" in names
    if arch in ("qwen2moe", "qwen3moe"):
        # llama.cpp has no key for dense layers among MoE ones; they are the ones without a router
        config["mlp_only_layers"] = [
            i for i in range(config["num_hidden_layers"]) if f"blk.{i}.ffn_gate_inp.weight" not in names
        ]
        config["qkv_bias" if arch == "qwen2moe" else "attention_bias"] = has_bias
    elif arch.startswith("ernie4_5"):
        config["use_bias"] = has_bias
    factors = {key: tensor for tensor in gguf_file.tensors if (key := _ROPE_FACTORS.get(tensor.name))}
    if factors:
        scaling = config.setdefault("rope_scaling", {"rope_type": "longrope"})
        for key, tensor in factors.items():
            scaling[key] = np.asarray(gguf_file.tensor_data(tensor), dtype=np.float64).reshape(-1).tolist()
    return config


def unsupported_architecture(meta: dict[str, Any]) -> str:
    """Why a GGUF's `general.architecture` cannot load, with the ones that can."""
    known = ", ".join(sorted(_ARCHITECTURES))
    return f"GGUF architecture {meta.get('general.architecture')!r} is not supported (supported: {known})"


def config_from_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """A config.json-style dict from GGUF key/values (tensor-dependent fields aside)."""
    arch = meta.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise UnsupportedModelError(unsupported_architecture(meta))

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    rope_dims = key("rope.dimension_count")
    if arch == "phi3":
        # Phi-3 has no head_dim of its own; rope.dimension_count is the rotary part of a head
        head_dim = int(key("attention.key_length") or hidden // heads)
    else:
        head_dim = int(key("attention.key_length") or rope_dims or hidden // heads)
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
    if rope_dims and int(rope_dims) != head_dim:
        config["partial_rotary_factor"] = int(rope_dims) / head_dim
    if key("attention.sliding_window"):
        config["sliding_window"] = int(key("attention.sliding_window"))
    scaling_type = key("rope.scaling.type")
    if scaling_type in ("linear", "yarn"):
        config["rope_scaling"] = {
            "rope_type": scaling_type,
            "factor": float(key("rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(key("rope.scaling.original_context_length", 0) or 0),
        }
    elif arch == "phi3" and key("rope.scaling.original_context_length"):
        config["original_max_position_embeddings"] = int(key("rope.scaling.original_context_length"))
        if key("rope.scaling.attn_factor") is not None:
            config["rope_scaling"] = {
                "rope_type": "longrope",
                "attention_factor": float(key("rope.scaling.attn_factor")),
            }
    if arch == "gemma3":
        # what llama.cpp assumes where the file has no key: every 6th layer global, local rotary
        # base 10000, queries scaled by head_dim (hidden / heads for the 62-layer 27B)
        config["sliding_window_pattern"] = 6
        config["rope_local_base_freq"] = float(key("rope.freq_base_swa", 10000.0))
        config["query_pre_attn_scalar"] = hidden // heads if config["num_hidden_layers"] == 62 else head_dim
    elif arch == "gemma2":
        # as llama.cpp reads a file without the keys: a 4096-position window on every other layer,
        # queries scaled by head_dim (hidden / heads for the 46-layer 27B), no soft-capping
        config["sliding_window"] = int(key("attention.sliding_window") or 4096)
        config["query_pre_attn_scalar"] = hidden // heads if config["num_hidden_layers"] == 46 else head_dim
        config["attn_logit_softcapping"] = key("attn_logit_softcapping")
        config["final_logit_softcapping"] = key("final_logit_softcapping")
    config.update(_expert_config(arch, key))
    return config


def _expert_config(arch: str, key: Any) -> dict[str, Any]:
    """The config.json expert fields of a MoE architecture from llama.cpp's expert keys."""
    experts, used = int(key("expert_count", 0) or 0), int(key("expert_used_count", 0) or 0)
    if not experts:
        return {}
    if arch == "llama":
        return {
            "architectures": [_LLAMA_WITH_EXPERTS],
            "num_local_experts": experts,
            "num_experts_per_tok": used,
        }
    if arch in ("qwen2moe", "qwen3moe"):
        config = {
            "num_experts": experts,
            "num_experts_per_tok": used,
            "moe_intermediate_size": int(key("expert_feed_forward_length")),
            # as llama.cpp runs them: Qwen3-MoE renormalises the chosen experts' weights, Qwen2-MoE not
            "norm_topk_prob": arch == "qwen3moe",
        }
        if key("expert_shared_feed_forward_length"):
            config["shared_expert_intermediate_size"] = int(key("expert_shared_feed_forward_length"))
        return config
    if arch == "ernie4_5-moe":
        return {
            "moe_num_experts": experts,
            "moe_k": used,
            "moe_intermediate_size": int(key("expert_feed_forward_length")),
            "moe_num_shared_experts": int(key("expert_shared_count", 0) or 0),
            "moe_layer_start_index": int(key("leading_dense_block_count", 0) or 0),
            "moe_layer_end_index": -1,
            "moe_layer_interval": int(key("interleave_moe_layer_step", 1) or 1),
        }
    return {}
