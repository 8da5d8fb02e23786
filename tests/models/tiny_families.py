"""Tiny random-weight checkpoints of Phi-3 (LongRoPE, partial rotary), Phi-4, Mixtral, Qwen2-MoE,
Qwen3-MoE, Gemma 2 and Gemma 3 (text), rebuilt from a seed, plus the GGUF files llama.cpp's
converter made of them.

Shared by tests/models/test_tiny_families.py and tools/make_family_references.py (which loads
exactly these weights into transformers for tests/fixtures/tiny_family_references.json, and
runs llama.cpp's `convert_hf_to_gguf.py` on them for tests/fixtures/gguf/). Tensor names and
config keys are those of the models' Hugging Face checkpoints (the tool checks transformers
loads them with no missing or unexpected keys). Weights are drawn like tiny_checkpoints'.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from tiny_checkpoints import FIXTURES, _mlp_shapes, seeded_tensors, write_safetensors

GGUF_DIR = FIXTURES / "gguf"
REFERENCES = FIXTURES / "tiny_family_references.json"
NEW_TOKENS = 24

_COMMON = {
    "vocab_size": 160,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 128,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}

#: config.json of each tiny model, with the seed of its weights and the engine's max_model_len
#: for each of its prompt sets (LongRoPE picks its factors by context length)
SPECS: dict[str, dict[str, Any]] = {
    "phi3": {
        "seed": 3301,
        "config": _COMMON
        | {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 64,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": 64,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0, 1.25, 1.9, 2.7],
                "long_factor": [1.1, 2.6, 4.5, 8.0],
            },
            "sliding_window": None,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attention_dropout": 0.0,
        },
    },
    "phi4": {
        "seed": 3401,
        "config": _COMMON
        | {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "num_hidden_layers": 2,
            "intermediate_size": 48,
            "rms_norm_eps": 1e-05,
            "rope_theta": 250000.0,
            "original_max_position_embeddings": 128,
            "rope_scaling": None,
            "sliding_window": None,
        },
    },
    # every layer slides over 20 positions (not a multiple of the 16-slot KV blocks): prompts and
    # generations cross the window
    "phi3_window": {
        "seed": 3503,
        "config": _COMMON
        | {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "num_hidden_layers": 2,
            "intermediate_size": 48,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 128,
            "rope_scaling": None,
            "sliding_window": 20,
        },
    },
    "mixtral": {
        "seed": 8701,
        "config": _COMMON
        | {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "num_hidden_layers": 2,
            "intermediate_size": 32,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
            "sliding_window": None,
        },
    },
    "qwen2_moe": {
        "seed": 2601,
        "config": _COMMON
        | {
            "architectures": ["Qwen2MoeForCausalLM"],
            "model_type": "qwen2_moe",
            "vocab_size": 320,
            "num_hidden_layers": 2,
            "intermediate_size": 48,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "use_sliding_window": False,
        },
    },
    "qwen3_moe": {
        "seed": 3601,
        "config": _COMMON
        | {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "vocab_size": 320,
            "num_hidden_layers": 2,
            "head_dim": 16,
            "intermediate_size": 48,
            "moe_intermediate_size": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "attention_bias": False,
            "use_sliding_window": False,
        },
    },
    "qwen3_moe_mixed": {
        "seed": 3602,
        "config": _COMMON
        | {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "vocab_size": 320,
            "num_hidden_layers": 3,
            "head_dim": 16,
            "intermediate_size": 48,
            "moe_intermediate_size": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "attention_bias": False,
            "use_sliding_window": False,
        },
    },
    "gemma3": {
        "seed": 3701,
        "config": _COMMON
        | {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "num_hidden_layers": 6,
            "head_dim": 16,
            "intermediate_size": 48,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "sliding_window": 64,
            "sliding_window_pattern": 6,
            "query_pre_attn_scalar": 16,
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
            "attention_bias": False,
            "tie_word_embeddings": True,
        },
    },
    # every other layer slides over 20 positions (prompts and generations cross it); scores of
    # about +-4 (Gemma's (1 + w) norms, weights ~ 1/sqrt(in)) against an attention cap of 3, so
    # the cap binds and changes the tokens (the references record the uncapped ones too); the
    # final cap of 5 bends the logits (only they show it: tanh keeps the argmax); the embedding
    # drawn 4x smaller than the others', so the tied head does not just repeat the last token
    "gemma2": {
        "seed": 3202,
        "weight_scales": {"model.embed_tokens.weight": 0.25},
        "config": _COMMON
        | {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "num_hidden_layers": 4,
            "head_dim": 16,
            "intermediate_size": 64,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0,
            "sliding_window": 20,
            "query_pre_attn_scalar": 16,
            "attn_logit_softcapping": 3.0,
            "final_logit_softcapping": 5.0,
            "attention_bias": False,
            "tie_word_embeddings": True,
        },
    },
}

#: the models also converted to GGUF: llama.cpp's qwen2moe/qwen3moe have no dense layers
#: (`mlp_only_layers`), so the mixed Qwen3-MoE is a Hugging Face directory only
GGUF_MODELS = [name for name in SPECS if name != "qwen3_moe_mixed"]

#: the Qwen MoE models have 320 tokens: llama.cpp converts their vocabulary as byte-level BPE,
#: which needs the 256 byte tokens (the others have a 160-piece SentencePiece vocabulary)

#: token-id prompts (ids 3..159, so no special token) whose greedy continuations are recorded;
#: `max_model_len` is what the engine runs them with
SHORT_PROMPTS = [[1, 17, 42, 99, 5, 63, 120], [3, 8, 150, 77, 21, 9, 44, 130, 11, 60]]
#: longer than phi3's original_max_position_embeddings (64): transformers and the engine then
#: both use LongRoPE's long factors
LONG_PROMPTS = [[3 + (37 * i + 11) % 157 for i in range(70)]]
PROMPT_SETS = {"short": (SHORT_PROMPTS, 64), "long": (LONG_PROMPTS, 128)}


def prompt_sets(name: str) -> dict[str, tuple[list[list[int]], int]]:
    """The prompt sets of model `name`: the long one only where LongRoPE or a sliding window
    (then prompt and generation run past it) makes it differ."""
    config = SPECS[name]["config"] if name in SPECS else {}
    scaling = config.get("rope_scaling")
    if (
        scaling
        and scaling.get("type", scaling.get("rope_type")) == "longrope"
        or config.get("sliding_window")
    ):
        return PROMPT_SETS
    return {"short": PROMPT_SETS["short"]}


def _head_dim(config: dict[str, Any]) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def moe_layers(config: dict[str, Any]) -> set[int]:
    layers = range(config["num_hidden_layers"])
    if config["model_type"] == "mixtral":
        return set(layers)
    if "num_experts" not in config:
        return set()
    step, dense = config["decoder_sparse_step"], set(config["mlp_only_layers"])
    return {i for i in layers if i not in dense and (i + 1) % step == 0}


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, in the Hugging Face names, with its [out, in] shape."""
    hidden, vocab, kind = config["hidden_size"], config["vocab_size"], config["model_type"]
    head_dim = _head_dim(config)
    q_rows = config["num_attention_heads"] * head_dim
    kv_rows = config["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[attn + "o_proj.weight"] = (hidden, q_rows)
        if kind == "phi3":
            shapes[attn + "qkv_proj.weight"] = (q_rows + 2 * kv_rows, hidden)
            shapes[p + "mlp.gate_up_proj.weight"] = (2 * config["intermediate_size"], hidden)
            shapes[p + "mlp.down_proj.weight"] = (hidden, config["intermediate_size"])
            continue
        for proj, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
            shapes[f"{attn}{proj}_proj.weight"] = (rows, hidden)
            if kind == "qwen2_moe":
                shapes[f"{attn}{proj}_proj.bias"] = (rows,)
        if kind in ("qwen3_moe", "gemma3_text"):
            shapes[attn + "q_norm.weight"] = (head_dim,)
            shapes[attn + "k_norm.weight"] = (head_dim,)
        if kind in ("gemma2", "gemma3_text"):
            shapes[p + "pre_feedforward_layernorm.weight"] = (hidden,)
            shapes[p + "post_feedforward_layernorm.weight"] = (hidden,)
        if i not in moe_layers(config):
            shapes.update(_mlp_shapes(p + "mlp.", hidden, config["intermediate_size"]))
        elif kind == "mixtral":
            experts, inner = config["num_local_experts"], config["intermediate_size"]
            block = p + "block_sparse_moe."
            shapes[block + "gate.weight"] = (experts, hidden)
            for e in range(experts):
                shapes[f"{block}experts.{e}.w1.weight"] = (inner, hidden)
                shapes[f"{block}experts.{e}.w3.weight"] = (inner, hidden)
                shapes[f"{block}experts.{e}.w2.weight"] = (hidden, inner)
        else:
            experts, inner = config["num_experts"], config["moe_intermediate_size"]
            shapes[p + "mlp.gate.weight"] = (experts, hidden)
            for e in range(experts):
                shapes.update(_mlp_shapes(f"{p}mlp.experts.{e}.", hidden, inner))
            if kind == "qwen2_moe":
                shared = config["shared_expert_intermediate_size"]
                shapes.update(_mlp_shapes(p + "mlp.shared_expert.", hidden, shared))
                shapes[p + "mlp.shared_expert_gate.weight"] = (1, hidden)
    return shapes


def tensors(name: str) -> dict[str, np.ndarray]:
    """The seeded float32 weights of tiny model `name` (times its `weight_scales`, where given)."""
    spec = SPECS[name]
    weights = seeded_tensors(tensor_shapes(spec["config"]), spec["seed"])
    for tensor_name, factor in spec.get("weight_scales", {}).items():
        weights[tensor_name] = weights[tensor_name] * np.float32(factor)
    return weights


def write_checkpoint(directory: str | os.PathLike[str], name: str) -> dict[str, np.ndarray]:
    """Write tiny model `name` as a Hugging Face directory; returns its tensors."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = tensors(name)
    write_safetensors(directory, weights)
    (directory / "config.json").write_text(json.dumps(SPECS[name]["config"], indent=1), encoding="utf-8")
    return weights


#: block-quantised conversions besides the f32 one
QUANTISED_GGUFS = {"mixtral": ("q8_0",), "gemma2": ("q8_0",)}


def gguf_path(name: str, outtype: str = "f32") -> Path:
    """The committed GGUF llama.cpp's converter wrote from tiny model `name`."""
    return GGUF_DIR / f"tiny-{name.replace('_', '-')}-{outtype}.gguf"
