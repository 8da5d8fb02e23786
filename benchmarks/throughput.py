"""Throughput of fastdeploy against transformers on the embedded SmolLM2 model, in one run.

Measures, greedy decoding with EOS ignored so every run generates the same number of tokens:
  * batch:   16 prompts x 128 new tokens (output tokens/s over the whole call)
  * prefill: one 512-token prompt, 1 new token (prompt tokens/s, best of 3 runs)
  * decode:  one stream, 128 new tokens (tokens/s after the first)
transformers (float32, the same GGUF weights dequantised) runs in the same process when it is
installed (`pip install torch==2.13.0 transformers gguf accelerate`); the script prints a table and
the ratio fastdeploy / transformers for each figure.

`--checkpoint safetensors` first writes the GGUF out as a float32 Hugging Face directory and has
both engines load that: fastdeploy then reads float32 weights too, so the comparison shows what
the engine does apart from reading the GGUF's 4-bit blocks.

    python benchmarks/throughput.py [--skip-peer] [--checkpoint gguf|safetensors] [--batch 16] [--new-tokens 128]

`--device cuda` runs the GPU comparison instead (benchmarks/throughput_cuda.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from fastdeploy.model_resolver import embedded_model_path

PROMPT_WORDS = [
    "The",
    "history",
    "of",
    "printing",
    "begins",
    "with",
    "woodblocks",
    "and",
    "movable",
    "type,",
    "spreads",
    "through",
    "Europe",
    "with",
    "Gutenberg's",
    "press,",
    "and",
    "reshapes",
    "science,",
    "religion",
    "and",
    "politics",
    "as",
    "books",
    "become",
    "cheap.",
]


#: the 512-token prefill is well under a second: each engine's best of this many runs is reported
PREFILL_REPEATS = 3


def make_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` distinct prompts of exactly `length` tokens."""
    prompts = []
    for i in range(count):
        words = PROMPT_WORDS[i % len(PROMPT_WORDS) :] + PROMPT_WORDS
        ids = tokenizer.encode(f"Document {i}: " + " ".join(words * (1 + length // len(words))))
        prompts.append(ids[:length])
    return prompts


def bench_fastdeploy(args) -> dict[str, float]:
    from fastdeploy import LLM, SamplingParams

    llm = LLM(model=args.model, max_model_len=2048, max_num_seqs=max(args.batch, 16))
    tok = llm.get_tokenizer()
    batch_prompts = make_prompts(tok, args.batch, args.prompt_len)
    new = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    llm.generate(batch_prompts[:2], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up

    start = time.perf_counter()
    outputs = llm.generate(batch_prompts, new, use_tqdm=False)
    batch_seconds = time.perf_counter() - start
    generated = sum(len(o.outputs.token_ids) for o in outputs)

    long_prompt = make_prompts(tok, 1, 512)

    def prefill() -> float:
        start = time.perf_counter()
        llm.generate(long_prompt, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
        return time.perf_counter() - start

    prefill_seconds = min(prefill() for _ in range(PREFILL_REPEATS))

    (single,) = llm.generate(batch_prompts[:1], new, use_tqdm=False)
    decode_seconds = single.metrics.model_execute_time - single.metrics.first_token_time
    return {
        "batch": generated / batch_seconds,
        "prefill": 512 / prefill_seconds,
        "decode": (len(single.outputs.token_ids) - 1) / decode_seconds,
    }


def bench_transformers(args) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    if args.model.endswith(".gguf"):
        folder, name = os.path.split(args.model)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tokenizer.pad_token_id = tokenizer.eos_token_id
    tokenizer.padding_side = "left"

    def generate(prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        return time.perf_counter() - start, (out.shape[1] - width) * len(prompts)

    class _Tok:
        def encode(self, text):
            return tokenizer.encode(text, add_special_tokens=False)

    batch_prompts = make_prompts(_Tok(), args.batch, args.prompt_len)
    generate(batch_prompts[:2], 4)  # warm-up
    seconds, generated = generate(batch_prompts, args.new_tokens)
    batch = generated / seconds
    long_prompt = make_prompts(_Tok(), 1, 512)
    prefill_seconds = min(generate(long_prompt, 1)[0] for _ in range(PREFILL_REPEATS))
    first_seconds, _ = generate(batch_prompts[:1], 1)
    all_seconds, produced = generate(batch_prompts[:1], args.new_tokens)
    return {
        "batch": batch,
        "prefill": 512 / prefill_seconds,
        "decode": (produced - 1) / (all_seconds - first_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--skip-peer", action="store_true", help="measure fastdeploy only")
    parser.add_argument(
        "--checkpoint",
        choices=("gguf", "safetensors"),
        default="gguf",
        help="load the embedded SmolLM2 GGUF, or a float32 safetensors directory written from it",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: random-weight SmolLM2- and Llama-1B-shaped models on the GPU (benchmarks/throughput_cuda.py)",
    )
    parser.add_argument("--shapes", default="smollm2,1b", help="--device cuda: model shapes to run")
    parser.add_argument("--json", help="--device cuda: also write the figures to this file")
    args = parser.parse_args()
    if args.device == "cuda":
        import throughput_cuda

        throughput_cuda.main(args)
        return
    args.model = embedded_model_path()
    with tempfile.TemporaryDirectory(prefix="smollm2-float32-") as directory:
        if args.checkpoint == "safetensors":
            from fastdeploy.model_executor.gguf_export import export_hf_directory

            export_hf_directory(args.model, directory)
            args.model = directory
        run(args)


def run(args: argparse.Namespace) -> None:
    """Both engines on `args.model`, then the table."""
    ours = bench_fastdeploy(args)
    peer = None
    if not args.skip_peer:
        try:
            peer = bench_transformers(args)
        except ImportError as exc:
            print(f"transformers peer skipped: {exc}")
    labels = {
        "batch": f"{args.batch} prompts x {args.new_tokens} new tokens (output tok/s)",
        "prefill": "512-token prefill (prompt tok/s)",
        "decode": f"single-stream decode, {args.new_tokens} tokens (tok/s)",
    }
    print(f"{'benchmark':<52} {'fastdeploy':>11} {'transformers':>13} {'ratio':>7}")
    for key, label in labels.items():
        theirs = f"{peer[key]:13.1f}" if peer else f"{'-':>13}"
        ratio = f"{ours[key] / peer[key]:6.2f}x" if peer else f"{'-':>7}"
        print(f"{label:<52} {ours[key]:11.1f} {theirs} {ratio}")


if __name__ == "__main__":
    main()
