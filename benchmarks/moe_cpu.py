"""Sparse-MoE decode on the CPU: fastdeploy (float32 and `quantization="wint4"`) against
transformers (float32) on the same random-weight Qwen3-MoE checkpoint, in one run.

The checkpoint is Qwen3-MoE's layout at a width that fits a 2-core machine (by default hidden 512,
8 layers, 32 experts with 4 active, expert FFN 256, SmolLM2's 49152-token vocabulary and tokenizer,
taken from the embedded model). Each engine decodes one stream of `--new-tokens` greedy tokens
after a short prompt, ignoring end-of-sequence, in rounds interleaved between the engines; the
table gives each engine's median tok/s and its ratio to transformers:

    python benchmarks/moe_cpu.py [--layers 8] [--experts 32] [--active 4] [--rounds 2]

Random weights: the tokens are meaningless, and greedy agreement between the rows is not the
point here (tests/models/test_tiny_families.py checks it on tiny checkpoints).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("FD_LOG_LEVEL", "WARNING")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_checkpoint(directory: Path, args: argparse.Namespace) -> None:
    """A random Qwen3-MoE checkpoint (float32 safetensors) with the embedded model's tokenizer."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from fastdeploy.model_executor.gguf_export import export_hf_directory
    from fastdeploy.model_resolver import embedded_model_path

    with tempfile.TemporaryDirectory(prefix="smollm2-export-") as exported:
        export_hf_directory(embedded_model_path(), exported)
        for name in TOKENIZER_FILES:
            if (Path(exported) / name).exists():
                shutil.copy(Path(exported) / name, directory / name)
    config = Qwen3MoeConfig(
        vocab_size=49152,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        moe_intermediate_size=args.expert_ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=args.hidden // 8,
        num_experts=args.experts,
        num_experts_per_tok=args.active,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)


def prompt_ids(length: int) -> list[int]:
    return [(7 * i + 11) % 40000 + 100 for i in range(length)]


def fastdeploy_rate(llm, args: argparse.Namespace) -> float:
    from fastdeploy import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    prompt = {"prompt_token_ids": prompt_ids(args.prompt_len)}
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)  # prefill only
    start = time.perf_counter()
    output = llm.generate(prompt, params, use_tqdm=False)[0]
    seconds = time.perf_counter() - start
    return len(output.outputs.token_ids) / seconds


def transformers_rate(model, args: argparse.Namespace) -> float:
    import torch

    ids = torch.tensor([prompt_ids(args.prompt_len)])
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=1, do_sample=False)
        start = time.perf_counter()
        out = model.generate(
            ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False
        )
        seconds = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--active", type=int, default=4)
    parser.add_argument("--expert-ffn", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from fastdeploy import LLM

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="qwen3-moe-bench-") as directory:
        write_checkpoint(Path(directory), args)
        engines = {
            "fastdeploy float32": LLM(model=directory, max_model_len=1024, max_num_seqs=4),
            "fastdeploy wint4": LLM(
                model=directory, max_model_len=1024, max_num_seqs=4, quantization="wint4"
            ),
        }
        reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        rates: dict[str, list[float]] = {name: [] for name in [*engines, "transformers float32"]}
        for _ in range(args.rounds):
            for name, llm in engines.items():
                rates[name].append(fastdeploy_rate(llm, args))
            rates["transformers float32"].append(transformers_rate(reference, args))
        for llm in engines.values():
            llm.shutdown()
    base = statistics.median(rates["transformers float32"])
    shape = (
        f"hidden {args.hidden}, {args.layers} layers, {args.experts} experts ({args.active} active), "
        f"expert FFN {args.expert_ffn}"
    )
    lines = [f"Qwen3-MoE decode, {shape}; one stream, {args.new_tokens} tokens, {args.rounds} rounds (tok/s)"]
    for name, values in rates.items():
        median = statistics.median(values)
        spread = f"{min(values):.1f}-{max(values):.1f}"
        lines.append(f"  {name:<22} {median:8.1f} ({spread})  {median / base:5.2f}x transformers")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
