"""Writes a GGUF model out as a Hugging Face directory (config.json, float32 safetensors, tokenizer).

Why: to run the same weights through engines that read only that layout (transformers, for the
benchmark's float32-checkpoint comparison) and through our own safetensors path (tests), the GGUF
dequantised exactly as `gguf` does.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from fastdeploy.input.gguf_tokenizer import GGUFTokenizerLoader
from fastdeploy.model_executor.loaders.gguf_loader import GGUFLoader

#: our architecture name -> transformers' `model_type`
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


def hf_config(gguf_path: str) -> dict[str, Any]:
    """config.json of the GGUF's model, as transformers reads it."""
    config = GGUFLoader().load_config(gguf_path)
    config.update({"model_type": _MODEL_TYPES[config["architectures"][0]], "torch_dtype": "float32"})
    return config


def float32_tensors(gguf_path: str) -> dict[str, np.ndarray]:
    """Every tensor under its transformers name, dequantised to float32."""
    return {
        name: np.ascontiguousarray(np.asarray(tensor), dtype=np.float32)
        for name, tensor in GGUFLoader().load_tensors(gguf_path)
    }


def write_hf_metadata(directory: str, gguf_path: str) -> None:
    """config.json, tokenizer.json and tokenizer_config.json (special tokens, chat template)."""
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(hf_config(gguf_path), handle)
    tokenizer = GGUFTokenizerLoader().load(gguf_path)
    tokenizer.backend.save(os.path.join(directory, "tokenizer.json"))
    names = {"bos_token": tokenizer.bos_token_id, "eos_token": tokenizer.eos_token_id}
    config = {key: tokenizer.id_to_token(value) for key, value in names.items() if value is not None}
    config.update({"add_bos_token": tokenizer.add_bos_token, "chat_template": tokenizer.chat_template})
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)


def export_hf_directory(gguf_path: str, directory: str) -> None:
    """A complete float32 Hugging Face directory of the GGUF's model in `directory`."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    save_file(float32_tensors(gguf_path), os.path.join(directory, "model.safetensors"))
    write_hf_metadata(directory, gguf_path)
