"""512-token prefill on one thread, timed in CPU seconds: fastdeploy against llama.cpp and transformers.

Why CPU time: on a shared machine other processes' load stretches wall times unevenly (two
threads that meet at a barrier after every product lose far more to a descheduled partner than
one thread does), so `throughput.py`'s two-thread ratios then say little about a quiet machine.
One thread's CPU seconds are what the product costs, whatever else runs. Each engine runs in its
own process on one thread (fastdeploy `FD_CPU_THREADS=1`; llama.cpp `n_threads=1`, `n_batch=512`;
transformers `torch.set_num_threads(1)`, float32), evaluates a 512-token prompt of random ids and
picks its first token, once to warm up and then `--repeats` times; the figure is the best run,
as prompt tokens per CPU second.

    python benchmarks/prefill_cpu_time.py --model FILE [--llama-cpp-python PY]
        [--transformers-python PY] [--variant LABEL:FD_KEY=VALUE,...] [--repeats 3]

A variant adds a fastdeploy row with those environment variables, e.g.
`--variant int8:FD_CPU_ACTIVATIONS=int8`; `FD_CPU_KERNELS=avx2` in the caller's environment
limits every fastdeploy row to the AVX2 kernels (pair it with an AVX2-only llama.cpp build).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

PROMPT = """
import numpy as np
prompts = [np.random.default_rng(seed).integers(100, 20000, 512).tolist() for seed in range(repeats + 1)]
"""
SNIPPETS = {
    "fastdeploy": """
import sys, time
from fastdeploy import LLM, SamplingParams
llm = LLM(model=sys.argv[1])
params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
def prefill(prompt):
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
""",
    "llama.cpp": """
import sys, time
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=2048, n_batch=512, n_threads=1, n_threads_batch=1, verbose=False)
def prefill(prompt):
    llm.reset()
    llm.eval(prompt)
    llm.sample(temp=0.0, top_k=1)
""",
    "transformers": """
import os, sys, time
import torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)
folder, name = os.path.split(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
def prefill(prompt):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=1,
                       min_new_tokens=1, pad_token_id=0)
""",
}
TIMING = """
best = None
for i, prompt in enumerate(prompts):
    start = time.process_time()
    prefill(prompt)
    seconds = time.process_time() - start
    if i and (best is None or seconds < best):
        best = seconds
print(best)
"""


def cpu_seconds(python: str, kind: str, model: str, repeats: int, env: dict[str, str]) -> float:
    """The best of `repeats` prefills' CPU seconds in one fresh process of `kind`."""
    code = f"repeats = {repeats}\n" + PROMPT + SNIPPETS[kind] + TIMING
    done = subprocess.run(
        [python, "-c", code, model],
        capture_output=True,
        text=True,
        env={**os.environ, "FD_CPU_THREADS": "1", "FD_LOG_LEVEL": "WARNING", **env},
    )
    if done.returncode != 0:
        sys.exit(f"{kind} failed on {model}:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    label, _, settings = text.partition(":")
    pairs = [item.split("=", 1) for item in settings.split(",") if item]
    if not label or any(len(pair) != 2 or not pair[0].startswith("FD_") for pair in pairs):
        raise argparse.ArgumentTypeError(f"--variant takes LABEL:FD_KEY=VALUE,...; got {text!r}")
    return label, dict(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a GGUF file")
    parser.add_argument("--llama-cpp-python", metavar="PY", help="an interpreter with llama-cpp-python")
    parser.add_argument(
        "--transformers-python", metavar="PY", help="an interpreter with torch and transformers"
    )
    parser.add_argument("--variant", type=parse_variant, action="append", default=[])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [("fastdeploy", "fastdeploy", sys.executable, {})]
    rows += [(f"fastdeploy {label}", "fastdeploy", sys.executable, env) for label, env in args.variant]
    peers = [("llama.cpp", args.llama_cpp_python), ("transformers", args.transformers_python)]
    rows += [(kind, kind, python, {}) for kind, python in peers if python]
    rates = {
        label: 512 / cpu_seconds(python, kind, args.model, args.repeats, env)
        for label, kind, python, env in rows
    }
    peer_rates = {label: rate for label, rate in rates.items() if not label.startswith("fastdeploy")}
    print(f"{os.path.basename(args.model)}: 512-token prefill, one thread, prompt tokens per CPU second")
    for label, rate in rates.items():
        ratios = (
            ""
            if label in peer_rates
            else "".join(f"  {rate / peer:5.2f}x {name}" for name, peer in peer_rates.items())
        )
        print(f"  {label:<22}{rate:8.1f}{ratios}")


if __name__ == "__main__":
    main()
