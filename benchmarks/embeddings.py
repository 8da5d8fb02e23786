"""Embeddings: fastdeploy's pooling runner against sentence-transformers on the same checkpoint, in
the same run.

The checkpoint is a random-weight Qwen3 saved by sentence-transformers with last-token pooling and
normalisation, as Qwen3-Embedding is published (tests/models/embedding_checkpoint.py). Shapes:
`small` (default): hidden 512, 8 layers, 8 query / 4 KV heads of 64, intermediate 1536, a
4096-word vocabulary; `tiny`: the tests' model. The sentences are `--words` random words each
(31, plus the `<|endoftext|>` the tokenizer appends: 32 tokens), `--sentences` of them (64).

Each side embeds all sentences in one call, best of `--repeats` after a warm-up call: fastdeploy
`LLM(..., runner="pooling").embed(sentences)`, sentence-transformers
`encode(sentences, batch_size=len(sentences))`; both float32 on the CPU with `--threads` threads
(default: the cores this process may use). Prints each side's sentences/s, fastdeploy's speed over
sentence-transformers', and the largest cosine distance between the two sides' embeddings.

    python benchmarks/embeddings.py [--shape small|tiny] [--sentences 64] [--words 31] [--repeats 5]
        [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "models"))
import embedding_checkpoint  # noqa: E402

from fastdeploy import LLM  # noqa: E402

SHAPES = {
    "small": {
        "hidden_size": 512,
        "layers": 8,
        "heads": 8,
        "kv_heads": 4,
        "intermediate_size": 1536,
        "extra_words": 4096,
    },
    "tiny": {},
}


def best_seconds(run, repeats: int) -> float:
    run()  # warm-up: first-call allocations, kernel packing
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
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--words", type=int, default=31)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()

    import torch  # after the arguments: --help needs no torch

    torch.set_num_threads(args.threads)
    vocabulary = embedding_checkpoint.vocabulary(SHAPES[args.shape].get("extra_words", 0))
    words = vocabulary[len(embedding_checkpoint.SPECIALS) :]
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, args.words)) for _ in range(args.sentences)]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model")
        reference = embedding_checkpoint.build(path, "lasttoken", True, **SHAPES[args.shape])
        llm = LLM(path, runner="pooling", cpu_threads=args.threads, max_model_len=args.words + 8)
        tokens = [len(output.prompt_token_ids) for output in llm.embed(sentences, use_tqdm=False)]

        def ours() -> np.ndarray:
            return np.array([o.outputs.embedding for o in llm.embed(sentences, use_tqdm=False)])

        def theirs() -> np.ndarray:
            with torch.inference_mode():
                return reference.encode(sentences, batch_size=len(sentences), convert_to_numpy=True)

        a, b = ours().astype(np.float64), theirs().astype(np.float64)
        distance = (1 - (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).max()
        fastdeploy_s = best_seconds(ours, args.repeats)
        reference_s = best_seconds(theirs, args.repeats)
    print(
        f"shape {args.shape}: {args.sentences} sentences of {min(tokens)}-{max(tokens)} tokens, "
        f"{args.threads} threads, best of {args.repeats}"
    )
    print(
        f"fastdeploy             {args.sentences / fastdeploy_s:9.1f} sentences/s ({fastdeploy_s * 1e3:.1f} ms)"
    )
    print(
        f"sentence-transformers  {args.sentences / reference_s:9.1f} sentences/s ({reference_s * 1e3:.1f} ms)"
    )
    print(f"speed-up {reference_s / fastdeploy_s:.2f}x; largest cosine distance {distance:.2e}")


if __name__ == "__main__":
    main()
