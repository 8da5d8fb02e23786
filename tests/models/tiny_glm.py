"""A tiny random-weight GLM-4.5 checkpoint (`Glm4MoeForCausalLM`), rebuilt from a seed, and
transformers' float32 greedy tokens on it: q/k/v biases, per-head q/k norms, half-width rotary,
a dense first layer, then grouped-routed experts (4 groups of which 2 compete) with a shared
expert and the routed scaling factor, and a multi-token-prediction layer after the decoder's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from tiny_checkpoints import seeded_tensors, write_ernie_tokenizer, write_safetensors
from tiny_deepseek import grouped_moe_mlp_shapes

CONFIG: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.5,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 3,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
    "use_qk_norm": True,
    "attention_bias": True,
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
SEED = 4545
NEW_TOKENS = 24
PROMPTS = [
    [1, 17, 42, 99, 5, 63, 120],
    [3, 8, 150, 77, 21, 9, 44, 130, 11, 60],
    [3 + (37 * i + 11) % 157 for i in range(70)],
]


def _layer_shapes(layer: int, prefix: str) -> dict[str, tuple[int, ...]]:
    c = CONFIG
    hidden, head_dim = c["hidden_size"], c["head_dim"]
    q_rows, kv_rows = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    shapes: dict[str, tuple[int, ...]] = {
        prefix + "input_layernorm.weight": (hidden,),
        prefix + "post_attention_layernorm.weight": (hidden,),
        attn + "q_proj.weight": (q_rows, hidden),
        attn + "k_proj.weight": (kv_rows, hidden),
        attn + "v_proj.weight": (kv_rows, hidden),
        attn + "q_proj.bias": (q_rows,),
        attn + "k_proj.bias": (kv_rows,),
        attn + "v_proj.bias": (kv_rows,),
        attn + "o_proj.weight": (hidden, q_rows),
        attn + "q_norm.weight": (head_dim,),
        attn + "k_norm.weight": (head_dim,),
    }
    return shapes | grouped_moe_mlp_shapes(c, layer, mlp)


def _tensors(with_mtp: bool) -> dict[str, np.ndarray]:
    hidden, vocab, layers = CONFIG["hidden_size"], CONFIG["vocab_size"], CONFIG["num_hidden_layers"]
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers + 1):  # the last: the multi-token-prediction layer (a MoE block and more)
        shapes.update(_layer_shapes(i, f"model.layers.{i}."))
    mtp = f"model.layers.{layers}."
    shapes.update(
        {
            mtp + "enorm.weight": (hidden,),
            mtp + "hnorm.weight": (hidden,),
            mtp + "eh_proj.weight": (hidden, 2 * hidden),
        }
    )
    tensors = seeded_tensors(shapes, SEED)
    return tensors if with_mtp else {k: v for k, v in tensors.items() if not k.startswith(mtp)}


def write_checkpoint(directory: Path, with_mtp: bool, **changes: Any) -> Path:
    """The tiny GLM-4.5 as a Hugging Face directory with a tokenizer; `changes` edit config.json
    (None removes a field)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors(directory, _tensors(with_mtp))
    config = {k: v for k, v in (CONFIG | changes).items() if v is not None}
    (directory / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    write_ernie_tokenizer(directory)
    return directory


def transformers_greedy(directory: Path) -> list[list[int]]:
    """transformers' float32 greedy continuations of PROMPTS (EOS ignored), checking that
    transformers reads every tensor of the directory by GLM's own names."""
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        return [
            model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[
                0, len(p) :
            ].tolist()
            for p in PROMPTS
        ]
