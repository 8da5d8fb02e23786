"""Single-stream decode on a GPU against the HBM roofline, with CUDA graphs on and off.

A decode step of one sequence reads every weight once, so its speed limit is the memory
bandwidth: roofline tok/s = bandwidth / weight bytes. This prints, for random-weight Llama
checkpoints of SmolLM2-135M's and Llama-3.2-1B's shapes (tools/gpu_checkpoints.py) in bfloat16:

  * tok/s of one prompt decoding `--tokens` new tokens (best of `--repeats`), greedy and sampled
    (temperature 0.8, top-p 0.9: the sampling stage runs inside the graph replay);
  * the roofline fraction = weight bytes x tok/s / bandwidth (issue 32's goal: >= 50% for the 1B
    shape in bf16);

each with the decode steps replayed from CUDA graphs (the default) and eagerly
(`enforce_eager=True`). Weight bytes are those of the matrices a step reads (attention and MLP
projections of every layer, and the LM head), 2 per bf16 weight. The bandwidth is `--bandwidth`
(GB/s) or, by default, the one a device-to-device copy of 1 GiB reaches here (a read and a write
per byte), which is below the datasheet figure (H100 SXM 3.35 TB/s, H200 4.8 TB/s).

    python benchmarks/decode_roofline.py [--shapes smollm2,1b] [--tokens 256] [--json FILE]

Without a CUDA GPU it says why and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import tempfile
import time

PROMPT_LEN = 32
BF16_BYTES = 2


def _checkpoints():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "gpu_checkpoints.py")
    spec = importlib.util.spec_from_file_location("gpu_checkpoints", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weight_bytes(config: dict) -> int:
    """Bytes of the matrices one decode step reads in bf16: q, k, v, o, gate, up, down of every
    layer and the LM head (the embedding lookup reads one row; norms are negligible)."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads", heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * config["intermediate_size"]
    return BF16_BYTES * (config["num_hidden_layers"] * (attention + mlp) + config["vocab_size"] * hidden)


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (bytes read + written per second), best of 10."""
    import torch

    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        target.copy_(source)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    del source, target
    return 2 * (1 << 30) / best / 1e9


def decode_rates(directory: str, vocab: int, tokens: int, repeats: int, eager: bool) -> dict[str, float]:
    """Single-stream tok/s, greedy and sampled, of one engine."""
    import numpy as np

    from fastdeploy import LLM, SamplingParams

    llm = LLM(
        model=directory,
        device="cuda",
        dtype="bfloat16",
        max_model_len=PROMPT_LEN + tokens + 16,
        max_num_seqs=8,
        enforce_eager=eager,
    )
    prompt = np.random.default_rng(1).integers(300, vocab, PROMPT_LEN).tolist()
    settings = {
        "greedy": SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
        "sampled": SamplingParams(temperature=0.8, top_p=0.9, seed=0, max_tokens=tokens, ignore_eos=True),
    }
    rates = {}
    for name, params in settings.items():
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            (output,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
            assert len(output.outputs.token_ids) == tokens
        rates[name] = tokens / best
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="smollm2,1b")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth", type=float, default=None, help="GB/s (default: measured copy)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from fastdeploy.backends.cuda.backend import CudaBackend

    reason = CudaBackend.unavailable_reason()
    if reason is not None:
        print(f"decode roofline benchmark skipped: {reason}")
        return 0
    bandwidth = args.bandwidth or copy_bandwidth()
    checkpoints = _checkpoints()
    report: dict = {"bandwidth_gbs": bandwidth, "shapes": {}}
    print(f"bandwidth {bandwidth:.0f} GB/s ({'given' if args.bandwidth else 'measured copy'})")
    print(f"{'shape':<10} {'graphs':<7} {'sampling':<8} {'tok/s':>9} {'roofline':>9}")
    for shape in args.shapes.split(","):
        config = checkpoints.SHAPES[shape]
        nbytes = weight_bytes(config)
        figures: dict = {"weight_bytes": nbytes}
        with tempfile.TemporaryDirectory(prefix=f"fd-roofline-{shape}-") as directory:
            checkpoints.make_checkpoint(directory, "llama", shape)
            for label, eager in (("on", False), ("off", True)):
                rates = decode_rates(directory, config["vocab_size"], args.tokens, args.repeats, eager)
                gc.collect()  # the engine's weights and KV cache go before the next one loads
                figures[f"graphs_{label}"] = {
                    name: {"tok_s": rate, "roofline": nbytes * rate / (bandwidth * 1e9)}
                    for name, rate in rates.items()
                }
                for name, entry in figures[f"graphs_{label}"].items():
                    print(
                        f"{shape:<10} {label:<7} {name:<8} {entry['tok_s']:9.1f} {entry['roofline']:8.1%}",
                        flush=True,
                    )
        report["shapes"][shape] = figures
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
