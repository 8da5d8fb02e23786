"""Time of a block-quantised product of 1 to a few rows (concurrent decode streams), per kernel set.

Why: a decode step of B streams multiplies B activation rows by every weight. Up to some row count
the sub-block kernels read the quantised blocks directly in tiles of rows; past it each task widens
its panels to float32 once and reuses them. Where that threshold sits decides whether 3 streams cost
about as much as 2 or as much as 5: this prints, per type and shape (ERNIE-4.5-0.3B's by default),
the median time of each row count over `--repeats` rounds (row counts interleaved inside a round, so
a load change on a shared machine hits them alike) and its ratio to the 2-row time.

The weights are random block bytes with the high exponent bit of every byte cleared (finite float16
factors); the time does not depend on the values.

    python benchmarks/few_rows.py [--isa avx2] [--threads 1,2] [--types Q4_K,Q6_K,Q4_0]
        [--rows 1,2,3,4,5,8] [--shape IN:OUT ...] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from fastdeploy.backends.cpu import native
from fastdeploy.formats.ggml_tensor import GGMLTensor

SHAPES = ["1024:3072", "3072:1024"]
CALLS = 3  # products per timing


def random_weight(type_name: str, cols: int, depth: int, rng: np.random.Generator) -> GGMLTensor:
    qtype = GGMLQuantizationType[type_name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (cols * depth // block_size, type_size), dtype=np.uint8) & 0xBF
    return GGMLTensor(int(qtype), blocks.reshape(cols, -1), (cols, depth))


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
    args = parser.parse_args()
    rows_list = [int(value) for value in args.rows.split(",")]
    rng = np.random.default_rng(0)
    print(f"{args.isa}, load average {os.getloadavg()[0]:.1f}; median ms per product (ratio to 2 rows)")
    for type_name in args.types.split(","):
        for shape in args.shape or SHAPES:
            depth, cols = (int(value) for value in shape.split(":"))
            packed = native.pack([random_weight(type_name, cols, depth, rng)])
            x = rng.standard_normal((max(rows_list), depth)).astype(np.float32)
            for threads in (int(value) for value in args.threads.split(",")):
                times: dict[int, list[float]] = {rows: [] for rows in rows_list}
                for _ in range(args.repeats):
                    for rows in rows_list:
                        native.matmul(x[:rows], packed, args.isa, threads)
                        start = time.perf_counter()
                        for _ in range(CALLS):
                            native.matmul(x[:rows], packed, args.isa, threads)
                        times[rows].append((time.perf_counter() - start) / CALLS * 1e3)
                median = {rows: float(np.median(values)) for rows, values in times.items()}
                two = median.get(2, median[rows_list[0]])
                cells = "  ".join(
                    f"{rows}r {median[rows]:.3f} ({median[rows] / two:.2f})" for rows in rows_list
                )
                print(f"{type_name:6} {depth:>5}->{cols:<5} {threads}t  {cells}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
