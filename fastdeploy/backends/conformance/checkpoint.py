"""Tiny random checkpoints in Hugging Face's on-disk format, for tests that need a whole model.

A byte-level BPE `tokenizer.json` with the 256 byte tokens and no merges (every byte is a
token) plus `<|endoftext|>`, and a config.json + model.safetensors pair. Weights come from a
seeded generator, so a checkpoint is the same on every machine.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from fastdeploy.input.gguf_tokenizer import bytes_to_unicode

END_OF_TEXT = "<|endoftext|>"
BYTE_VOCAB_SIZE = 257  # 256 bytes + <|endoftext|>


def write_byte_tokenizer(directory: str, extra_tokens: tuple[str, ...] = ()) -> int:
    """Write tokenizer.json: token id = byte value (no merges), then `<|endoftext|>` (special,
    id 256), then `extra_tokens` as plain added tokens (kept in decoded text). Returns 256."""
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(END_OF_TEXT, special=True)])
    tokenizer.add_tokens([AddedToken(token, special=False) for token in extra_tokens])
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    return tokenizer.token_to_id(END_OF_TEXT)


def write_checkpoint(directory: str, config: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """config.json + model.safetensors (float32) in `directory`."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=1)
    save_file(
        {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in weights.items()},
        os.path.join(directory, "model.safetensors"),
    )


def tiny_llama(directory: str, seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A 2-layer Llama (hidden 64, 4 heads / 2 KV heads, tied embeddings) with a byte tokenizer."""
    eos = write_byte_tokenizer(directory)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": BYTE_VOCAB_SIZE,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "eos_token_id": eos,
    }
    rng = np.random.default_rng(seed)
    hidden, inter, head_dim = 64, 128, 16

    def matrix(rows: int, cols: int, scale: float = 0.15) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    weights = {"model.embed_tokens.weight": matrix(BYTE_VOCAB_SIZE, hidden, 0.5)}
    weights["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
        weights[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(hidden)).astype(
            np.float32
        )
        weights[p + "self_attn.q_proj.weight"] = matrix(4 * head_dim, hidden)
        weights[p + "self_attn.k_proj.weight"] = matrix(2 * head_dim, hidden)
        weights[p + "self_attn.v_proj.weight"] = matrix(2 * head_dim, hidden)
        weights[p + "self_attn.o_proj.weight"] = matrix(hidden, 4 * head_dim)
        weights[p + "mlp.gate_proj.weight"] = matrix(inter, hidden)
        weights[p + "mlp.up_proj.weight"] = matrix(inter, hidden)
        weights[p + "mlp.down_proj.weight"] = matrix(hidden, inter)
    write_checkpoint(directory, config, weights)
    return config, weights
