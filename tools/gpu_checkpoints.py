"""Random-weight Hugging Face checkpoints of real model shapes, made with transformers.

The GPU checks (tests/gpu, benchmarks/throughput_cuda.py) need whole models of realistic size
where no model hub is reachable: transformers builds them from a config with its own seeded
initialisation and saves them as safetensors, next to a byte-level tokenizer.json (token id =
byte; ids past 256 decode to nothing, which is all a benchmark or a token comparison needs).

    python tools/gpu_checkpoints.py DIRECTORY [--arch llama|qwen3|ernie_moe] [--shape smollm2|1b]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: SmolLM2-135M and Llama-3.2-1B, the two shapes issue 9 measures
SHAPES = {
    "smollm2": {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "1b": {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
}

#: ERNIE-4.5 MoE experts per shape (kept small enough to build in seconds)
MOE = {
    "smollm2": {"moe_num_experts": 16, "moe_k": 4, "moe_intermediate_size": 384, "moe_num_shared_experts": 1},
    "1b": {"moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 1024, "moe_num_shared_experts": 1},
}


def make_checkpoint(directory: str, arch: str = "llama", shape: str = "smollm2", seed: int = 0) -> str:
    """Write config.json, model.safetensors (float32) and tokenizer.json; returns `directory`."""
    import torch
    import transformers

    from fastdeploy.backends.conformance.checkpoint import write_byte_tokenizer

    fields = dict(SHAPES[shape], max_position_embeddings=4096, rms_norm_eps=1e-5)
    # no EOS: both engines generate exactly the tokens asked for, and nothing bans a token
    fields.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if arch == "llama":
        config = transformers.LlamaConfig(**fields)
        model_class = transformers.LlamaForCausalLM
    elif arch == "qwen3":
        fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
        config = transformers.Qwen3Config(**fields)
        model_class = transformers.Qwen3ForCausalLM
    elif arch == "ernie_moe":
        fields.update(MOE[shape], moe_layer_start_index=1, use_bias=False)
        config = transformers.Ernie4_5_MoeConfig(**fields)
        model_class = transformers.Ernie4_5_MoeForCausalLM
    else:
        raise ValueError(f"arch must be llama, qwen3 or ernie_moe, got {arch!r}")
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    if arch == "ernie_moe":  # a non-zero correction bias, so choosing and weighting differ
        for name, tensor in model.named_parameters():
            if "e_score_correction_bias" in name:
                torch.nn.init.normal_(tensor, std=0.02)
        for name, buffer in model.named_buffers():
            if "e_score_correction_bias" in name:
                buffer.normal_(std=0.02)
    model.save_pretrained(directory)  # safetensors (transformers 5 has no other format)
    write_byte_tokenizer(directory)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--arch", default="llama", choices=("llama", "qwen3", "ernie_moe"))
    parser.add_argument("--shape", default="smollm2", choices=tuple(SHAPES))
    args = parser.parse_args()
    make_checkpoint(args.directory, args.arch, args.shape)
    print(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
