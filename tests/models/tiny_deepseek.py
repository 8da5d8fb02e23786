"""Tiny random-weight DeepSeek-V3 checkpoints, rebuilt from a seed, and transformers' float32
greedy tokens on them.

Two shapes: "v3" (low-rank queries, YaRN with mscale, 4 expert groups of which 2 compete, a
dense first layer, then MoE layers with a shared expert, one MTP layer) and "v2lite" (direct
q_proj, no rope scaling, one group, unnormalised weights). Tensor names are the Hugging Face
checkpoints'; the MTP layer (`model.layers.{num_hidden_layers}.*`: enorm, hnorm, eh_proj,
shared_head and a decoder block) is written by hand, as transformers drops it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from tiny_checkpoints import _mlp_shapes, seeded_tensors, write_ernie_tokenizer, write_safetensors

NEW_TOKENS = 24

_BASE: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 160,
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 3,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 12,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_interleave": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
    "use_cache": True,
}

SPECS: dict[str, dict[str, Any]] = {
    "v3": {
        "seed": 4101,
        "config": _BASE
        | {
            "q_lora_rank": 24,
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "first_k_dense_replace": 1,
            "num_nextn_predict_layers": 1,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    },
    "v2lite": {
        "seed": 4102,
        "config": _BASE
        | {
            "q_lora_rank": None,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": False,
            "routed_scaling_factor": 1.0,
            "first_k_dense_replace": 2,
            "num_hidden_layers": 4,
            "num_nextn_predict_layers": 0,
            "rope_scaling": None,
        },
    },
}

#: token-id prompts (ids 3..159); the long one passes the YaRN original context (64)
PROMPTS = [
    [1, 17, 42, 99, 5, 63, 120],
    [3, 8, 150, 77, 21, 9, 44, 130, 11, 60],
    [3 + (37 * i + 11) % 157 for i in range(80)],
]
MAX_MODEL_LEN = 128


def _block_shapes(config: dict[str, Any], layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
    """One decoder layer's tensors (also the MTP layer's block)."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    lora, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    nope, v_dim = config["qk_nope_head_dim"], config["v_head_dim"]
    attn = prefix + "self_attn."
    shapes = {
        prefix + "input_layernorm.weight": (hidden,),
        prefix + "post_attention_layernorm.weight": (hidden,),
        attn + "kv_a_proj_with_mqa.weight": (lora + rope, hidden),
        attn + "kv_a_layernorm.weight": (lora,),
        attn + "kv_b_proj.weight": (heads * (nope + v_dim), lora),
        attn + "o_proj.weight": (hidden, heads * v_dim),
    }
    if config["q_lora_rank"] is None:
        shapes[attn + "q_proj.weight"] = (heads * (nope + rope), hidden)
    else:
        q_lora = config["q_lora_rank"]
        shapes[attn + "q_a_proj.weight"] = (q_lora, hidden)
        shapes[attn + "q_a_layernorm.weight"] = (q_lora,)
        shapes[attn + "q_b_proj.weight"] = (heads * (nope + rope), q_lora)
    return shapes | grouped_moe_mlp_shapes(config, layer, prefix + "mlp.")


def grouped_moe_mlp_shapes(config: dict[str, Any], layer: int, mlp: str) -> dict[str, tuple[int, ...]]:
    """One layer's feed-forward tensors as DeepSeek-V3 and GLM-4.5 store them: a dense MLP for the
    first `first_k_dense_replace` layers, then routed experts, their gate and bias, shared experts."""
    hidden = config["hidden_size"]
    if layer < config["first_k_dense_replace"]:
        return _mlp_shapes(mlp, hidden, config["intermediate_size"])
    experts, inner = config["n_routed_experts"], config["moe_intermediate_size"]
    shapes = {mlp + "gate.weight": (experts, hidden), mlp + "gate.e_score_correction_bias": (experts,)}
    for e in range(experts):
        shapes.update(_mlp_shapes(f"{mlp}experts.{e}.", hidden, inner))
    shapes.update(_mlp_shapes(mlp + "shared_experts.", hidden, inner * config["n_shared_experts"]))
    return shapes


def tensor_shapes(config: dict[str, Any], mtp: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint (the MTP layers' too when `mtp`), [out, in] shapes."""
    hidden, vocab, layers = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        shapes.update(_block_shapes(config, i, f"model.layers.{i}."))
    for i in range(layers, layers + (config["num_nextn_predict_layers"] if mtp else 0)):
        p = f"model.layers.{i}."
        shapes.update(_block_shapes(config, i, p))
        shapes.update(
            {
                p + "enorm.weight": (hidden,),
                p + "hnorm.weight": (hidden,),
                p + "eh_proj.weight": (hidden, 2 * hidden),
                p + "shared_head.norm.weight": (hidden,),
                p + "shared_head.head.weight": (vocab, hidden),
                p + "embed_tokens.weight": (vocab, hidden),
            }
        )
    return shapes


def tensors(name: str, config: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The seeded float32 weights of tiny model `name` (MTP layers included)."""
    config = config or SPECS[name]["config"]
    weights = seeded_tensors(tensor_shapes(config), SPECS[name]["seed"])
    layers = config["num_hidden_layers"]
    for i in range(layers, layers + config["num_nextn_predict_layers"]):
        # as in DeepSeek-V3's checkpoint, the MTP layer's embedding and head are the model's
        weights[f"model.layers.{i}.embed_tokens.weight"] = weights["model.embed_tokens.weight"]
        weights[f"model.layers.{i}.shared_head.head.weight"] = weights["lm_head.weight"]
    return weights


def write_checkpoint(
    directory: str | os.PathLike[str], name: str, mtp: bool = True, **changes: Any
) -> dict[str, np.ndarray]:
    """Model `name` as a Hugging Face directory (with a tokenizer); `changes` edit config.json
    (None removes a field). Returns its tensors."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = tensors(name)
    layers = SPECS[name]["config"]["num_hidden_layers"]
    written = {k: v for k, v in weights.items() if mtp or _layer_of(k) < layers}
    write_safetensors(directory, written)
    config = dict(SPECS[name]["config"])
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    write_ernie_tokenizer(directory)
    return weights


def _layer_of(tensor_name: str) -> int:
    parts = tensor_name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else -1


def transformers_greedy(directory: str | os.PathLike[str], prompts: list[list[int]]) -> list[list[int]]:
    """transformers' float32 greedy continuations (NEW_TOKENS each, EOS ignored) from a checkpoint
    directory without MTP tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=torch.float32, attn_implementation="eager"
    )
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        return [
            model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
