"""Load time of one GGUF file: fastdeploy's `LLM(model=FILE)` against llama.cpp's `Llama(FILE)`.

Each sample is a fresh process that imports the engine, builds it on the file (both with the same
context length and thread count) and generates one token; the figures are the medians over
`--repeats` samples, interleaved engine by engine, after one unrecorded warm-up each (so the
page cache holds the file, and fastdeploy's weight cache, `FD_WEIGHT_CACHE`, holds its repacked
weights, as on every start after the first):

* import: importing the engine's package;
* load: from calling the constructor to its return (ready to generate);
* first token: one generated token after that (llama.cpp maps the file and reads it on first use);
* total: process start to the first token.

    python benchmarks/load_time.py --model FILE [--llama-cpp-python PY] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SNIPPETS = {
    "fastdeploy": """
import json, os, sys, time
t0 = time.perf_counter()
from fastdeploy import LLM, SamplingParams
t1 = time.perf_counter()
llm = LLM(model=sys.argv[1], max_model_len=int(sys.argv[2]), cpu_threads=int(sys.argv[3]))
t2 = time.perf_counter()
llm.generate("Hello", SamplingParams(max_tokens=1), use_tqdm=False)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first token": t3 - t2}))
""",
    "llama.cpp": """
import json, os, sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
t1 = time.perf_counter()
threads = int(sys.argv[3])
llm = Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=threads, n_threads_batch=threads,
            verbose=False)
t2 = time.perf_counter()
llm("Hello", max_tokens=1)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1, "first token": t3 - t2}))
""",
}
FIGURES = ("import", "load", "first token", "total")


def sample(python: str, kind: str, args: argparse.Namespace) -> dict[str, float]:
    """One fresh process's figures, seconds."""
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-c", SNIPPETS[kind], args.model, str(args.context), str(args.threads)],
        capture_output=True,
        text=True,
        env={**os.environ, "FD_LOG_LEVEL": os.environ.get("FD_LOG_LEVEL", "WARNING")},
    )
    total = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{kind} failed on {args.model}:\n{done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {**figures, "total": total}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a GGUF file")
    parser.add_argument("--llama-cpp-python", metavar="PY", help="an interpreter with llama-cpp-python")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context", type=int, default=2048, help="both engines' context length")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", metavar="PATH", help="also write every sample to this file")
    args = parser.parse_args()
    engines = {"fastdeploy": sys.executable}
    if args.llama_cpp_python:
        engines["llama.cpp"] = args.llama_cpp_python
    for kind, python in engines.items():  # warm-up: page cache, weight cache
        sample(python, kind, args)
    samples: dict[str, list[dict[str, float]]] = {kind: [] for kind in engines}
    for _ in range(args.repeats):
        for kind, python in engines.items():
            samples[kind].append(sample(python, kind, args))
    print(f"{os.path.basename(args.model)}: seconds, median (min-max) of {args.repeats} fresh processes")
    print(f"  {'':<12}" + "".join(f"{figure:>22}" for figure in FIGURES))
    for kind, runs in samples.items():
        cells = []
        for figure in FIGURES:
            values = [run[figure] for run in runs]
            cells.append(f"{statistics.median(values):8.2f} ({min(values):5.2f}-{max(values):5.2f})")
        print(f"  {kind:<12}" + "".join(f"{cell:>22}" for cell in cells))
    if "llama.cpp" in samples:
        for figure in ("load", "total"):
            ours = statistics.median(run[figure] for run in samples["fastdeploy"])
            theirs = statistics.median(run[figure] for run in samples["llama.cpp"])
            print(f"  {figure}: fastdeploy / llama.cpp = {ours / theirs:.2f}x (goal <= 2x)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(samples, handle, indent=1)


if __name__ == "__main__":
    main()
