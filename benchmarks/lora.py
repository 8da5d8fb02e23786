"""Throughput with LoRA adapters against the base model, in one run on one engine.

16 requests spread over 4 adapters (rank 16 on q/k/v/o and gate/up/down, PEFT format, random
weights of the model's shapes) against the same 16 requests on the base model, greedy, on the
embedded SmolLM2 (or `--model`). Both workloads run on one engine with `enable_lora=True`, so
they share everything but the adapters; each is timed `--repeats` times, alternating, and the
best run of each is kept. Goal: the adapters' tokens/s >= 0.8x the base model's.

    python benchmarks/lora.py [--model PATH] [--requests 16] [--adapters 4] [--rank 16] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
from safetensors.numpy import save_file

from fastdeploy import LLM, LoRARequest, SamplingParams

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(directory: str, config: object, rank: int, seed: int) -> None:
    """A PEFT LoRA adapter with random A and B for a model of `config`'s shapes."""
    rng = np.random.default_rng(seed)
    hidden, head_dim = config.hidden_size, config.head_dim
    q_rows, kv_rows = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    inner = config.intermediate_size
    shapes = {
        "self_attn.q_proj": (hidden, q_rows),
        "self_attn.k_proj": (hidden, kv_rows),
        "self_attn.v_proj": (hidden, kv_rows),
        "self_attn.o_proj": (q_rows, hidden),
        "mlp.gate_proj": (hidden, inner),
        "mlp.up_proj": (hidden, inner),
        "mlp.down_proj": (inner, hidden),
    }
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for module, (fan_in, fan_out) in shapes.items():
            stem = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) / np.sqrt(fan_in)).astype(
                np.float32
            )
            tensors[f"{stem}.lora_B.weight"] = (0.1 * rng.standard_normal((fan_out, rank))).astype(np.float32)
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    adapter_config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS)}
    with open(os.path.join(directory, "adapter_config.json"), "w", encoding="utf-8") as handle:
        json.dump(adapter_config, handle)


def timed(llm: LLM, prompts: list[str], params: SamplingParams, loras: list) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    seconds = time.perf_counter() - start
    for output in outputs:
        if output.error_code != 200:
            raise SystemExit(f"request failed: {output.error_msg}")
    return seconds, sum(len(output.outputs[0].token_ids) for output in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(
        args.model,
        device=args.device,
        max_model_len=1024,
        max_num_seqs=args.requests,
        enable_lora=True,
        max_loras=args.adapters,
        max_lora_rank=args.rank,
        enable_prefix_caching=False,
    )
    config = llm.llm_engine.model_config
    with tempfile.TemporaryDirectory() as scratch:
        adapters = []
        for index in range(args.adapters):
            path = os.path.join(scratch, f"adapter-{index}")
            write_adapter(path, config, args.rank, seed=index)
            adapters.append(LoRARequest(f"adapter-{index}", index + 1, path))
        prompts = [
            f"Request {index}: write a short story about the number {index}."
            for index in range(args.requests)
        ]
        spread = [adapters[index % len(adapters)] for index in range(args.requests)]
        base = [None] * args.requests
        params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
        for loras in (base, spread):  # warm up: adapters read and placed, first-call costs
            timed(llm, prompts[:2], SamplingParams(temperature=0, max_tokens=4), loras[:2])
        best = {"base": float("inf"), "lora": float("inf")}
        tokens = {}
        for _ in range(args.repeats):
            for name, loras in (("base", base), ("lora", spread)):
                seconds, count = timed(llm, prompts, params, loras)
                best[name] = min(best[name], seconds)
                tokens[name] = count
    rates = {name: tokens[name] / best[name] for name in best}
    print(
        f"{args.requests} requests x {args.new_tokens} tokens, {args.adapters} adapters of rank {args.rank} "
        f"({llm.llm_engine.backend.describe()}), best of {args.repeats}"
    )
    print(f"base model: {rates['base']:.1f} tok/s")
    print(f"LoRA:       {rates['lora']:.1f} tok/s ({rates['lora'] / rates['base']:.2f}x the base model)")


if __name__ == "__main__":
    main()
