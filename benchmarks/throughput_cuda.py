"""`benchmarks/throughput.py --device cuda`: the engine against transformers on the same GPU.

For random-weight checkpoints of SmolLM2-135M's and Llama-3.2-1B's shapes (built on the fly with
transformers, tools/gpu_checkpoints.py), both engines in bfloat16, greedy, EOS ignored:

  * single stream: one prompt, 128 new tokens (tok/s)
  * 16 / 64 / 256 prompts x 128 new tokens (output tok/s over the whole call)
  * prefill: 8 prompts x 2048 tokens, 1 new token (prompt tok/s)

and prints a table with the ratio fastdeploy / transformers (issue 9's targets on an H100:
>= 50x single stream, >= 20x at 256 x 128, >= 1x prefill). transformers runs batched
`generate` with left padding. Without a CUDA GPU it says why and exits 0.

    python benchmarks/throughput.py --device cuda [--shapes smollm2,1b] [--stepwise] [--json FILE]

`--stepwise` adds a column: the engine with `async_scheduling=False` (each step reads its tokens
before the next is scheduled), to show what overlapping the host's work with the GPU's gains.
`--quantizations wint8,wint4,fp8` adds a column per weight quantisation (wint4 in groups of 64,
which divide both shapes' widths).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import tempfile
import time

PROMPT_LEN = 32
NEW_TOKENS = 128
BATCHES = (16, 64, 256)
PREFILL = (8, 2048)
TARGETS = {"single": 50.0, "batch_256": 20.0, "prefill": 1.0}


def _checkpoints():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "gpu_checkpoints.py")
    spec = importlib.util.spec_from_file_location("gpu_checkpoints", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(300, vocab, (count, length)).tolist()


def bench_fastdeploy(
    directory: str, vocab: int, async_scheduling: bool | None = None, **options: object
) -> dict[str, float]:
    from fastdeploy import LLM, SamplingParams

    llm = LLM(
        model=directory,
        device="cuda",
        dtype="bfloat16",
        max_model_len=PREFILL[1] + 16,
        max_num_seqs=256,
        async_scheduling=async_scheduling,
        **options,
    )
    figures = {}

    def generate(prompts: list[list[int]], new_tokens: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        assert all(len(o.outputs.token_ids) == new_tokens for o in outputs)
        return elapsed

    generate(_prompts(4, PROMPT_LEN, vocab, 99), 8)  # warm-up: kernels compiled
    figures["single"] = NEW_TOKENS / generate(_prompts(1, PROMPT_LEN, vocab, 1), NEW_TOKENS)
    for batch in BATCHES:
        figures[f"batch_{batch}"] = (
            batch * NEW_TOKENS / generate(_prompts(batch, PROMPT_LEN, vocab, batch), NEW_TOKENS)
        )
    count, length = PREFILL
    prompts = _prompts(count, length, vocab, 7)
    generate(prompts, 1)
    figures["prefill"] = count * length / min(generate(prompts, 1) for _ in range(3))
    return figures  # the engine and its KV cache go with this frame


def bench_transformers(directory: str, vocab: int) -> dict[str, float]:
    import torch
    import transformers

    model = (
        transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).to("cuda").eval()
    )
    figures = {}

    def generate(prompts: list[list[int]], new_tokens: int) -> float:
        ids = torch.tensor(prompts, device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        return time.perf_counter() - start

    generate(_prompts(4, PROMPT_LEN, vocab, 99), 8)
    figures["single"] = NEW_TOKENS / generate(_prompts(1, PROMPT_LEN, vocab, 1), NEW_TOKENS)
    for batch in BATCHES:
        figures[f"batch_{batch}"] = (
            batch * NEW_TOKENS / generate(_prompts(batch, PROMPT_LEN, vocab, batch), NEW_TOKENS)
        )
    count, length = PREFILL
    prompts = _prompts(count, length, vocab, 7)
    generate(prompts, 1)
    figures["prefill"] = count * length / min(generate(prompts, 1) for _ in range(3))
    return figures


def main(args: argparse.Namespace) -> int:
    from fastdeploy.backends.cuda.backend import CudaBackend
    from fastdeploy.errors import InvalidArgumentError

    reason = CudaBackend.unavailable_reason()
    if reason is not None:
        print(f"cuda throughput benchmark skipped: {reason}")
        return 0
    checkpoints = _checkpoints()
    labels = {
        "single": f"single stream, {NEW_TOKENS} new tokens (tok/s)",
        **{f"batch_{b}": f"{b} prompts x {NEW_TOKENS} new tokens (output tok/s)" for b in BATCHES},
        "prefill": f"prefill {PREFILL[0]} x {PREFILL[1]} (prompt tok/s)",
    }
    report = {}
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"fd-{shape}-") as directory:
            checkpoints.make_checkpoint(directory, "llama", shape)
            vocab = checkpoints.SHAPES[shape]["vocab_size"]
            ours = bench_fastdeploy(directory, vocab)
            gc.collect()  # frees the engine's weights and KV cache before the next one loads
            stepwise = bench_fastdeploy(directory, vocab, async_scheduling=False) if args.stepwise else None
            gc.collect()
            quantized = {}
            for name in filter(None, args.quantizations.split(",")):
                try:
                    quantized[name] = bench_fastdeploy(
                        directory, vocab, quantization=name, quantization_group_size=64
                    )
                except InvalidArgumentError as exc:  # fp8 on a GPU before sm_89: refused, and why
                    print(f"{shape} {name}: not run: {exc}", flush=True)
                gc.collect()
            peer = None if args.skip_peer else bench_transformers(directory, vocab)
        report[shape] = {"fastdeploy": ours, "transformers": peer}
        if stepwise:
            report[shape]["fastdeploy_stepwise"] = stepwise
        for name, figures in quantized.items():
            report[shape][f"fastdeploy_{name}"] = figures
        print(f"\n{shape}-shaped Llama, bfloat16, random weights")
        step_header = f" {'stepwise':>9}" if stepwise else ""
        step_header += "".join(f" {name:>9}" for name in quantized)
        print(
            f"{'benchmark':<46} {'fastdeploy':>11}{step_header} {'transformers':>13} {'ratio':>8} {'target':>7}"
        )
        for key, label in labels.items():
            step = f" {stepwise[key]:9.1f}" if stepwise else ""
            step += "".join(f" {figures[key]:9.1f}" for figures in quantized.values())
            theirs = f"{peer[key]:13.1f}" if peer else f"{'-':>13}"
            ratio = f"{ours[key] / peer[key]:7.2f}x" if peer else f"{'-':>8}"
            target = f">= {TARGETS[key]:g}x" if key in TARGETS else ""
            print(f"{label:<46} {ours[key]:11.1f}{step} {theirs} {ratio} {target:>7}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 0
