"""Tiny random GPT-OSS checkpoints for the tests (tests/models/test_gpt_oss.py,
tests/parallel/test_gpt_oss_parallel.py), rebuilt from a seed, and transformers' float32 greedy
tokens on them.

The checkpoint has the features that matter: attention sinks (some large, so heads attend to
little), q/k/v/o biases, a sliding and a full layer, YaRN rotary, routers with biases, experts
whose gate/up values pass the clamp (weights large enough), expert biases; its experts float, or
MXFP4 blocks (transformers then runs the dequantised weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tiny_checkpoints as tiny
import torch
import transformers
from safetensors.numpy import save_file

NEW_TOKENS = 24
PROMPTS = [[1, 17, 42, 99, 5, 63, 120], [3, 8, 150, 77, 21, 9, 44, 130, 11, 60, 7, 7, 31]]
CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 160,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 64,
    },
    "attention_bias": True,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
#: per-tensor-kind standard deviations: large enough for the clamp, the sinks and the router to matter
STD = {"experts.gate_up_proj": 1.5, "sinks": 2.0, "router": 1.0, "norm": 0.2, "bias": 0.3}


def _std(name: str) -> float:
    for key, std in STD.items():
        if key in name:
            return std
    return 0.3


def reference_model(**overrides):
    """transformers' model with seeded weights (norm weights around 1)."""
    fields = {k: v for k, v in (CONFIG | overrides).items() if k not in ("architectures", "model_type")}
    config = transformers.GptOssConfig(**fields)
    model = transformers.GptOssForCausalLM(config).eval()
    rng = np.random.default_rng(2907)
    with torch.no_grad():
        for name, parameter in sorted(model.state_dict().items()):
            values = rng.standard_normal(tuple(parameter.shape)) * _std(name)
            if name.endswith("norm.weight"):
                values += 1.0
            parameter.copy_(torch.from_numpy(values.astype(np.float32)))
    return model


def reference_tokens(model) -> list[list[int]]:
    """Greedy tokens, end-of-sequence included like any other (the engine runs with ignore_eos)."""
    outputs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = list(prompt)
            for _ in range(NEW_TOKENS):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            outputs.append(ids[len(prompt) :])
    return outputs


def write_checkpoint(directory: Path, tensors: dict[str, np.ndarray], **overrides) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: np.ascontiguousarray(t) for name, t in tensors.items()}, str(directory / "model.safetensors")
    )
    (directory / "config.json").write_text(json.dumps(CONFIG | overrides, indent=1), encoding="utf-8")
    tiny.write_ernie_tokenizer(directory)  # any tokenizer: the prompts are token ids
    return str(directory)


def to_mxfp4(matrix: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random MXFP4 [out, in/32, 16] blocks and [out, in/32] scales of a matrix's shape, and their
    float32 values (element 2j in the low nibble of byte j; value fp4 * 2^(scale - 127))."""
    e2m1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    out, depth = matrix.shape
    codes = rng.integers(0, 16, (out, depth // 32, 32), dtype=np.uint8)
    scales = rng.integers(124, 128, (out, depth // 32), dtype=np.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    values = (e2m1[codes] * np.exp2(scales.astype(np.float64) - 127)[..., None]).reshape(out, depth)
    return blocks, scales, values.astype(np.float32)


def mxfp4_tensors(model) -> dict[str, np.ndarray]:
    """The checkpoint's tensors with random MXFP4 experts, and `model`'s experts replaced by
    their dequantised values (transformers keeps [experts, in, out]; the checkpoint blocks are
    [experts, out, in/32, 16])."""
    rng = np.random.default_rng(11)
    tensors = {}
    with torch.no_grad():
        for name, parameter in model.state_dict().items():
            if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                tensors[name] = parameter.numpy()
                continue
            parts = [to_mxfp4(expert.T, rng) for expert in parameter.numpy()]
            tensors[name + "_blocks"] = np.stack([blocks for blocks, _, _ in parts])
            tensors[name + "_scales"] = np.stack([scales for _, scales, _ in parts])
            parameter.copy_(torch.from_numpy(np.stack([values.T for _, _, values in parts])))
    return tensors
