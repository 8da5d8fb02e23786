"""What attention sinks cost on the cpu backend: one decode step's attention over a batch of
long contexts, with and without sinks (`attention_with_sinks` against `attention` /
`windowed_attention`), at a tensor-parallel rank's share of gpt-oss-20b's attention (32 of its
64 query heads, 4 of its 8 KV heads, head_dim 64).

    python benchmarks/attention_sinks.py [--threads 1] [--seqs 8] [--context 1024]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from fastdeploy.backends.conformance.op_checks import batch_layout
from fastdeploy.plugins.api import KVCacheSpec, build_backend

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 4, 64, 16


def best_ms(run: Callable[[], object], repeats: int = 20) -> float:
    """The fastest of `repeats` runs, in milliseconds (the others were disturbed)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    args = parser.parse_args()
    backend = build_backend("cpu", threads=args.threads)
    per_seq = args.context // BLOCK + 1
    spec = KVCacheSpec(1, args.seqs * per_seq, BLOCK, KV_HEADS, HEAD_DIM)
    (cache,) = backend.allocate_kv_cache(spec)
    rng = np.random.default_rng(0)
    tables = {str(s): list(range(s * per_seq, (s + 1) * per_seq)) for s in range(args.seqs)}

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    prefill = [(str(s), 0, args.context - 1) for s in range(args.seqs)]
    rows = args.seqs * (args.context - 1)
    batch = backend.prepare_batch(batch_layout(tables, prefill, BLOCK))
    backend.attention(
        normal(rows, HEADS, HEAD_DIM), *(normal(rows, KV_HEADS, HEAD_DIM) for _ in "kv"), cache, batch, 0.125
    )
    decode = backend.prepare_batch(
        batch_layout(tables, [(str(s), args.context - 1, args.context) for s in range(args.seqs)], BLOCK)
    )
    q, k, v = (
        normal(args.seqs, HEADS, HEAD_DIM),
        normal(args.seqs, KV_HEADS, HEAD_DIM),
        normal(args.seqs, KV_HEADS, HEAD_DIM),
    )
    sinks = normal(HEADS)
    print(
        f"{args.seqs} decodes of context {args.context}, {HEADS}/{KV_HEADS} heads, {args.threads} thread(s)"
    )
    for window in (0, 128):
        if window:
            plain = best_ms(lambda w=window: backend.windowed_attention(q, k, v, cache, decode, 0.125, w))
        else:
            plain = best_ms(lambda: backend.attention(q, k, v, cache, decode, 0.125))
        with_sinks = best_ms(
            lambda w=window: backend.attention_with_sinks(q, k, v, cache, decode, 0.125, sinks, w)
        )
        print(f"window {window or 'none'}: attention {plain:.2f} ms, with sinks {with_sinks:.2f} ms")


if __name__ == "__main__":
    main()
