"""Reads Hugging Face GPT-2 checkpoints into fastdeploy's terms.

GPT-2's config.json predates the names fastdeploy's `ModelConfig` reads (`n_embd` rather than
`hidden_size`, ...), and its tensors come with or without the `transformer.` prefix depending
on how the checkpoint was saved. This loader translates both, so the model class sees one
naming; it claims only GPT-2 directories (higher priority than the generic safetensors loader,
whose tensor reading it reuses).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.plugins.api import SafetensorsLoader, WeightLoadError

ARCHITECTURES = ("GPT2LMHeadModel",)
#: buffers some GPT-2 checkpoints store (causal mask constants), not weights
_BUFFERS = (".attn.bias", ".attn.masked_bias")


def _read_config(model_path: str) -> dict[str, Any]:
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise WeightLoadError(f"cannot read {model_path}/config.json: {exc}") from exc


def translate_config(config: dict[str, Any]) -> dict[str, Any]:
    """GPT-2 config.json -> the config.json-style dict fastdeploy's ModelConfig reads."""
    hidden = int(config["n_embd"])
    heads = int(config["n_head"])
    translated = dict(config)
    translated.update(
        architectures=list(config.get("architectures") or ARCHITECTURES[:1]),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        num_hidden_layers=int(config["n_layer"]),
        intermediate_size=int(config.get("n_inner") or 4 * hidden),
        max_position_embeddings=int(config.get("n_positions", 1024)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-5)),
    )
    return translated


class GPT2Loader(SafetensorsLoader):
    """config.json with model_type "gpt2" + safetensors; tensors named `transformer.*`."""

    name = "gpt2-safetensors"
    priority = 20
    reads = "a GPT-2 directory (config.json with model_type gpt2, *.safetensors)"

    def can_load(self, model_path: str) -> bool:
        """Only GPT-2 directories; anything unreadable is left to the generic loader's errors."""
        if not (os.path.isdir(model_path) and os.path.isfile(os.path.join(model_path, "config.json"))):
            return False
        try:
            config = _read_config(model_path)
        except WeightLoadError:
            return False
        if not isinstance(config, dict):
            return False
        architectures = config.get("architectures")
        return config.get("model_type") == "gpt2" or (
            isinstance(architectures, list) and any(name in ARCHITECTURES for name in architectures)
        )

    def load_config(self, model_path: str) -> dict[str, Any]:
        return translate_config(_read_config(model_path))

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray]]:
        for name, tensor in super().load_tensors(model_path):
            if name.endswith(_BUFFERS) or name == "lm_head.weight":
                continue  # lm_head is tied to wte in GPT-2
            yield (name if name.startswith("transformer.") else "transformer." + name), tensor
