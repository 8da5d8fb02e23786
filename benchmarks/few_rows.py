"""Time of a block-quantised product of 1 to a few rows (concurrent decode streams), per kernel set.

Why: a decode step of B streams multiplies B activation rows by every weight. Up to some row count
the sub-block kernels read the quantised blocks directly in tiles of rows; past it each task widens
its panels to float32 once and reuses them. Where that threshold sits decides whether 3 streams cost
about as much as 2 or as much as 5: this prints, per type and shape (ERNIE-4.5-0.3B's by default),
the median time of each row count over `--repeats` rounds (row counts interleaved inside a round, so
a load change on a shared machine hits them alike) and its ratio to the 2-row time.

The weights are random block bytes with the high exponent bit of every byte cleared (finite float16
factors); the time does not depend on the values. `--activations float32,int8` times both kernel
sets (FD_CPU_ACTIVATIONS), alternated inside a round too. A decode token's weights do not fit in the
caches, while one matrix does: `--stream MB` multiplies by that many megabytes of distinct copies
(huge pages, as the engine packs them) per timing and reports the time per product and the packed
bytes read per second, the rate of a decode step's products.

    python benchmarks/few_rows.py [--isa avx2] [--threads 1,2] [--types Q4_K,Q6_K,Q4_0]
        [--rows 1,2,3,4,5,8] [--shape IN:OUT ...] [--repeats 15] [--activations float32,int8]
        [--stream 300]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.native.weight_arena import WeightArena
from fastdeploy.formats.ggml_tensor import GGMLTensor

SHAPES = ["1024:3072", "3072:1024"]
CALLS = 3  # products per timing


def random_weight(type_name: str, cols: int, depth: int, rng: np.random.Generator) -> GGMLTensor:
    qtype = GGMLQuantizationType[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (cols * depth // block_size, type_size), dtype=np.uint8) & 0xBF
    return GGMLTensor(int(qtype), blocks.reshape(cols, -1), (cols, depth))


def copies(weight: GGMLTensor, activations: str, megabytes: float, arena: WeightArena) -> list:
    """The weight packed for `activations`, once, or as many times as fill `megabytes` (at least once)."""
    packed = [native.pack([weight], activations, arena)]
    while sum(copy.packed.nbytes for copy in packed) < megabytes * 1e6:
        packed.append(native.pack([weight], activations, arena))
    return packed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--isa", default=native.best_isa(), choices=native.ISAS)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--types", default="Q4_K,Q6_K,Q4_0")
    parser.add_argument("--rows", default="1,2,3,4,5,8")
    parser.add_argument("--shape", action="append", help="IN:OUT (default: ERNIE-4.5-0.3B's MLP)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--activations", default="float32", help="float32, int8 or both (comma-separated)")
    parser.add_argument("--stream", type=float, default=0.0, help="MB of distinct copies per timing")
    args = parser.parse_args()
    rows_list = [int(value) for value in args.rows.split(",")]
    kinds = args.activations.split(",")
    rng = np.random.default_rng(0)
    arena = WeightArena()
    unit = "GB/s of packed bytes" if args.stream else "ratio to 2 rows"
    print(f"{args.isa}, load average {os.getloadavg()[0]:.1f}; median ms per product ({unit})")
    for type_name in args.types.split(","):
        for shape in args.shape or SHAPES:
            depth, cols = (int(value) for value in shape.split(":"))
            weight = random_weight(type_name, cols, depth, rng)
            packed = {kind: copies(weight, kind, args.stream, arena) for kind in kinds}
            x = rng.standard_normal((max(rows_list), depth)).astype(np.float32)
            for threads in (int(value) for value in args.threads.split(",")):
                times = {(kind, rows): [] for kind in kinds for rows in rows_list}
                for _ in range(args.repeats):
                    for kind, rows in times:
                        weights = packed[kind]
                        native.matmul(x[:rows], weights[0], args.isa, threads)
                        calls = CALLS if len(weights) == 1 else 1
                        start = time.perf_counter()
                        for _ in range(calls):
                            for copy in weights:
                                native.matmul(x[:rows], copy, args.isa, threads)
                        times[kind, rows].append((time.perf_counter() - start) / calls / len(weights) * 1e3)
                median = {key: float(np.median(values)) for key, values in times.items()}
                for kind in kinds:
                    two = median.get((kind, 2), median[kind, rows_list[0]])
                    nbytes = packed[kind][0].packed.nbytes
                    cells = "  ".join(
                        f"{rows}r {median[kind, rows]:.3f} "
                        + (
                            f"({nbytes / median[kind, rows] / 1e6:.1f})"
                            if args.stream
                            else f"({median[kind, rows] / two:.2f})"
                        )
                        for rows in rows_list
                    )
                    label = f" {kind}" if len(kinds) > 1 else ""
                    print(f"{type_name:6} {depth:>5}->{cols:<5} {threads}t{label}  {cells}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
