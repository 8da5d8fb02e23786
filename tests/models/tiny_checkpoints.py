"""Tiny random-weight checkpoints of ERNIE-4.5 (dense, MoE), Qwen2, Qwen3 and Llama, rebuilt from a seed.

Shared by the tests (which write them as `-PT` and `-Paddle` directories and run them through
`LLM`) and by tools/make_model_references.py (which loads exactly these weights into
transformers to produce tests/fixtures/tiny_model_references.json). Only numpy and safetensors
are needed, so the tests run without torch; the fixture stores a checksum of the weights so a
change in numpy's random stream is reported as such rather than as a model mismatch.

Tensor names and config keys are those of the real checkpoints: transformers' `-PT` names (the
reference script checks transformers loads them with no missing or unexpected keys) and
FastDeploy's `-Paddle` names (`ernie.` prefix, fused `qkv_proj` [q|k|v] and `up_gate_proj`
[gate|up], linear weights [in, out]).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SENTENCEPIECE_FIXTURE = FIXTURES / "mistral_tokenizer.model.v1.gz"
MAX_POSITIONS = 128

_COMMON = {
    "vocab_size": 160,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": MAX_POSITIONS,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}

#: config.json of each tiny model (-PT form), with the seed of its weights
SPECS: dict[str, dict[str, Any]] = {
    "ernie4_5": {
        "seed": 4501,
        "config": _COMMON
        | {
            "architectures": ["Ernie4_5ForCausalLM"],
            "model_type": "ernie4_5",
            "num_hidden_layers": 2,
            "head_dim": 16,
            "intermediate_size": 48,
            "rms_norm_eps": 1e-05,
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
            "use_bias": False,
        },
    },
    "ernie4_5_moe": {
        "seed": 4502,
        "config": _COMMON
        | {
            "architectures": ["Ernie4_5_MoeForCausalLM"],
            "model_type": "ernie4_5_moe",
            "num_hidden_layers": 3,
            "head_dim": 8,
            "intermediate_size": 64,
            "rms_norm_eps": 1e-05,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "use_bias": False,
            "moe_num_experts": 8,
            "moe_k": 3,
            "moe_num_shared_experts": 2,
            "moe_intermediate_size": 16,
            "moe_layer_start_index": 1,
            "moe_layer_end_index": -1,
            "moe_layer_interval": 1,
            "moe_norm_min": 1e-12,
        },
    },
    "qwen2": {
        "seed": 2004,
        "config": _COMMON
        | {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "num_hidden_layers": 2,
            "intermediate_size": 48,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
        },
    },
    "llama": {
        "seed": 7001,
        "config": _COMMON
        | {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": 2,
            "intermediate_size": 48,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
        },
    },
    "qwen3": {
        "seed": 3001,
        "config": _COMMON
        | {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "num_hidden_layers": 2,
            "head_dim": 16,
            "intermediate_size": 48,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "use_sliding_window": False,
        },
    },
}

#: token-id prompts whose logits and greedy continuations the fixture records
PROMPTS = [[1, 17, 42, 99, 5, 63, 120], [3, 8, 150, 77, 21, 9, 44, 130, 11, 2, 60]]
NEW_TOKENS = 8


def _moe_layers(config: dict[str, Any]) -> set[int]:
    if "moe_num_experts" not in config:
        return set()
    layers = config["num_hidden_layers"]
    end = config["moe_layer_end_index"]
    end = layers - 1 if end == -1 else end
    interval = config["moe_layer_interval"]
    return {
        i for i in range(layers) if (i + 1) % interval == 0 and config["moe_layer_start_index"] <= i <= end
    }


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the -PT checkpoint, in transformers' names, with its [out, in] shape."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    qwen2 = config["model_type"] == "qwen2"
    qwen3 = config["model_type"] == "qwen3"
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        sizes = {"q": heads * head_dim, "k": kv_heads * head_dim, "v": kv_heads * head_dim}
        for name, size in sizes.items():
            shapes[f"{p}self_attn.{name}_proj.weight"] = (size, hidden)
            if qwen2:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (size,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        if qwen3:
            shapes[p + "self_attn.q_norm.weight"] = (head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (head_dim,)
        mlp = p + "mlp."
        if i in _moe_layers(config):
            experts, inner = config["moe_num_experts"], config["moe_intermediate_size"]
            shapes[mlp + "gate.weight"] = (experts, hidden)
            shapes[mlp + "moe_statics.e_score_correction_bias"] = (1, experts)
            for e in range(experts):
                shapes.update(_mlp_shapes(f"{mlp}experts.{e}.", hidden, inner))
            if config["moe_num_shared_experts"]:
                shapes.update(
                    _mlp_shapes(mlp + "shared_experts.", hidden, inner * config["moe_num_shared_experts"])
                )
        else:
            shapes.update(_mlp_shapes(mlp, hidden, config["intermediate_size"]))
    return shapes


def _mlp_shapes(prefix: str, hidden: int, inner: int) -> dict[str, tuple[int, ...]]:
    return {
        prefix + "gate_proj.weight": (inner, hidden),
        prefix + "up_proj.weight": (inner, hidden),
        prefix + "down_proj.weight": (hidden, inner),
    }


def pt_tensors(name: str, config: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The seeded float32 weights of tiny model `name` (or of `config` with its seed), in
    transformers' names and layout.

    Scales are chosen so logits spread over several units (greedy choices are far from ties):
    small embeddings (so the layers, not a token's own embedding, decide
    the next token), 1/sqrt(fan_in) projections, norms near 1, and a correction bias
    large enough to change which experts win.
    """
    config = config or SPECS[name]["config"]
    return seeded_tensors(tensor_shapes(config), SPECS[name]["seed"])


def seeded_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """float32 weights of the given [out, in] shapes, drawn in name order with the scales above."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for tensor_name, shape in sorted(shapes.items()):
        if tensor_name.endswith("e_score_correction_bias"):
            value = rng.uniform(0.0, 0.15, size=shape)
        elif tensor_name.endswith("norm.weight") or tensor_name.endswith("layernorm.weight"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif tensor_name.endswith(".bias"):
            value = 0.1 * rng.standard_normal(shape)
        elif tensor_name == "model.embed_tokens.weight":
            value = 0.4 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(shape[-1])
        tensors[tensor_name] = value.astype(np.float32)
    return tensors


def weights_checksum(tensors: dict[str, np.ndarray]) -> str:
    """sha256 over the names and float32 bytes, in name order."""
    digest = hashlib.sha256()
    for tensor_name in sorted(tensors):
        digest.update(tensor_name.encode())
        digest.update(np.ascontiguousarray(tensors[tensor_name], dtype=np.float32).tobytes())
    return digest.hexdigest()


def paddle_tensors(name: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same weights as an ERNIE `-Paddle` checkpoint stores them."""
    out: dict[str, np.ndarray] = {}
    for tensor_name, value in tensors.items():
        paddle_name = (
            "ernie." + tensor_name[len("model.") :] if tensor_name.startswith("model.") else tensor_name
        )
        base, _, kind = paddle_name.rpartition(".")
        if base.endswith(("self_attn.k_proj", "self_attn.v_proj", "up_proj")):
            continue  # written with their fused partner below
        if base.endswith("self_attn.q_proj"):
            stem = tensor_name[: -len(f"q_proj.{kind}")]
            fused = np.concatenate([tensors[f"{stem}{p}_proj.{kind}"] for p in "qkv"], axis=0)
            out[base[: -len("q_proj")] + f"qkv_proj.{kind}"] = _in_out(fused)
        elif base.endswith("gate_proj"):
            stem = tensor_name[: -len(f"gate_proj.{kind}")]
            fused = np.concatenate(
                [tensors[f"{stem}gate_proj.{kind}"], tensors[f"{stem}up_proj.{kind}"]], axis=0
            )
            out[base[: -len("gate_proj")] + f"up_gate_proj.{kind}"] = _in_out(fused)
        elif value.ndim == 2 and (base.endswith("_proj") or base.endswith(("mlp.gate", "lm_head"))):
            out[paddle_name] = _in_out(value)
        else:
            out[paddle_name] = value
    return out


def _in_out(value: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(value.T) if value.ndim == 2 else value


def paddle_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json of a -Paddle checkpoint: the dense model's architecture is spelled with an underscore."""
    paddle = dict(config)
    if config["architectures"] == ["Ernie4_5ForCausalLM"]:
        paddle["architectures"] = ["Ernie4_5_ForCausalLM"]
    return paddle


def write_safetensors(
    directory: str | os.PathLike[str], tensors: dict[str, np.ndarray], shards: int = 1
) -> None:
    """One model.safetensors, or `shards` files with a model.safetensors.index.json."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    names = sorted(tensors)
    if shards == 1:
        save_file(
            {n: tensors[n] for n in names}, str(directory / "model.safetensors"), metadata={"format": "pt"}
        )
        return
    weight_map = {}
    for shard, chunk in enumerate(np.array_split(np.array(names), shards)):
        filename = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in chunk}, str(directory / filename), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk.tolist(), filename))
    total = int(sum(t.nbytes for t in tensors.values()))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")


def write_checkpoint(
    directory: str | os.PathLike[str],
    name: str,
    layout: str = "pt",
    shards: int = 1,
    config_overrides: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Write tiny model `name` as a `-PT` ("pt") or `-Paddle` ("paddle") directory; returns the PT tensors."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = SPECS[name]["config"] | (config_overrides or {})
    tensors = pt_tensors(name, config)
    if layout == "paddle":
        write_safetensors(directory, paddle_tensors(name, tensors), shards)
        config = paddle_config(config)
    elif layout == "pt":
        write_safetensors(directory, tensors, shards)
    else:
        raise ValueError(f"layout must be 'pt' or 'paddle', got {layout!r}")
    (directory / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return tensors


def sentencepiece_model_bytes() -> bytes:
    """The real SentencePiece model of the fixture (Llama-2 style, 32000 pieces)."""
    return gzip.decompress(SENTENCEPIECE_FIXTURE.read_bytes())


#: ERNIE's special and tag tokens, added after the 32000 SentencePiece pieces as the real
#: tokenizer_config.json's `added_tokens_decoder` adds them (special: hidden by skip_special_tokens)
ERNIE_ADDED_TOKENS = [
    ("<|begin_of_sentence|>", True),
    ("<|end_of_sentence|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<response>", False),
    ("</response>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
]
FIRST_ADDED_ID = 32000
#: vocab_size of a tiny model that covers the whole tokenizer (for chat tests)
CHAT_VOCAB_SIZE = 32016

#: Qwen3's chat template, reduced to what decides the thinking switch (tools left out): with
#: enable_thinking=False the assistant prompt gets an empty, closed think block.
QWEN3_THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def added_token_id(text: str) -> int:
    return FIRST_ADDED_ID + [t for t, _ in ERNIE_ADDED_TOKENS].index(text)


#: the special-token names of ERNIE's tokenizer files (tokenizer_config.json, special_tokens_map.json)
ERNIE_SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<unk>",
    "cls_token": "<|begin_of_sentence|>",
    "sep_token": "<|end_of_sentence|>",
}


def write_ernie_tokenizer(
    directory: str | os.PathLike[str],
    chat_template: str | None = None,
    tokenizer_class: str = "Ernie4_5_Tokenizer",
) -> None:
    """tokenizer.model (the real SentencePiece fixture) plus ERNIE-style JSON files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.model").write_bytes(sentencepiece_model_bytes())
    config: dict[str, Any] = {
        "tokenizer_class": tokenizer_class,
        **ERNIE_SPECIAL_TOKENS,
        "add_bos_token": False,
        "added_tokens_decoder": {
            str(FIRST_ADDED_ID + i): {"content": text, "special": special, "normalized": False}
            for i, (text, special) in enumerate(ERNIE_ADDED_TOKENS)
        },
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (directory / "special_tokens_map.json").write_text(json.dumps(ERNIE_SPECIAL_TOKENS), encoding="utf-8")


def prefill_logits(model: Any, backend: Any, token_ids: list[int], **forward_kwargs: Any) -> np.ndarray:
    """Logits of every position of `token_ids` from one prefill pass of a built model, with a
    fresh paged KV cache (blocks of 16); `forward_kwargs` go to `model.forward` (extra inputs)."""
    from fastdeploy.backends.base import BatchLayout, KVCacheSpec

    config = model.config
    block_size, count = 16, len(token_ids)
    blocks = -(-count // block_size)
    spec = KVCacheSpec(
        config.num_hidden_layers, blocks, block_size, config.num_key_value_heads, config.head_dim
    )
    positions = np.arange(count, dtype=np.int64)
    layout = BatchLayout(
        input_ids=np.asarray(token_ids, dtype=np.int64),
        positions=positions,
        slot_mapping=positions,
        query_lens=np.asarray([count]),
        context_lens=np.asarray([count]),
        block_tables=np.arange(blocks, dtype=np.int64)[None, :],
        logits_indices=positions,
        block_size=block_size,
    )
    hidden = model.forward(
        backend.from_numpy(layout.input_ids),
        backend.from_numpy(positions),
        backend.prepare_batch(layout),
        backend.allocate_kv_cache(spec),
        **forward_kwargs,
    )
    return backend.to_numpy(model.compute_logits(hidden))
