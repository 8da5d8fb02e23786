"""The cpu backend's many-row products, in GFLOP/s, at a prompt pass's shapes.

Why: a prompt pass of many rows (an embedding batch, a long prefill) is bound by its products, and
which low-precision product is really faster depends on the CPU (a `vdpbf16ps` that retires at a
fifth of the float32 FMA rate makes bfloat16 slower than float32). Each row multiplies `--rows`
activation rows by one weight with each kernel, best of `--repeats` calls after a warm-up:

- float32: gemm.c on float32 panels (exact);
- bfloat16: gemm_bf16.c (`dtype="bfloat16"`);
- q8_0-int8: gemm_int8.c, Q8_0 blocks times activations quantised per 32 inputs (a GGUF Q8_0
  with FD_CPU_ACTIVATIONS=int8);
- w8a8: gemm_w8a8.c, int8 weights with a scale per output channel times activations quantised per
  128 inputs (quantization="wint8" with FD_CPU_ACTIVATIONS=int8).

The default shapes are those of benchmarks/embeddings.py's model (hidden 512, intermediate 1536:
qkv, o, gate/up and down projections) for 64 sentences of 32 tokens.

    python benchmarks/gemm_rates.py [--rows 2048] [--threads 1] [--isa avx512|avx2] [--repeats 5]
        [--shape IN:OUT ...]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from fastdeploy.backends.cpu import native
from fastdeploy.formats.weight_only import quantize_weight_only
from fastdeploy.model_executor.quantization import quantize_matrix

SHAPES = ["512:1024", "512:512", "512:3072", "1536:512"]


def best_seconds(run, repeats: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--isa", default=native.best_isa(), choices=native.ISAS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shape", action="append", help="IN:OUT (default: the embedding model's)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{args.rows} rows, {args.threads} threads, {args.isa}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'in x out':>12} {'float32':>9} {'bfloat16':>9} {'q8_0-int8':>10} {'w8a8':>9}  GFLOP/s")
    totals: dict[str, float] = {}
    for shape in args.shape or SHAPES:
        depth, cols = (int(value) for value in shape.split(":"))
        weight = rng.standard_normal((cols, depth)).astype(np.float32) * 0.05
        x = rng.standard_normal((args.rows, depth)).astype(np.float32)
        packed = {
            "float32": native.pack([weight]),
            "bfloat16": native.pack_bf16([weight]),
            "q8_0-int8": native.pack([quantize_matrix(weight, "Q8_0")], "int8"),
            "w8a8": native.pack([quantize_weight_only(weight, "wint8")], "int8"),
        }
        flops = 2 * args.rows * depth * cols / 1e9
        rates = []
        for name, w in packed.items():
            seconds = best_seconds(lambda x=x, w=w: native.matmul(x, w, args.isa, args.threads), args.repeats)
            totals[name] = totals.get(name, 0.0) + seconds
            rates.append(flops / seconds)
        print(f"{depth:>5} x {cols:<5}" + "".join(f" {rate:9.1f}" for rate in rates))
    print("all shapes:", ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in totals.items()))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
