"""Embeddings: fastdeploy's pooling runner against sentence-transformers on the same checkpoint, in
the same run.

The checkpoint is a random-weight Qwen3 saved by sentence-transformers with last-token pooling and
normalisation, as Qwen3-Embedding is published (tests/models/embedding_checkpoint.py). Shapes:
`small` (default): hidden 512, 8 layers, 8 query / 4 KV heads of 64, intermediate 1536, a
4096-word vocabulary; `tiny`: the tests' model; `smollm2`: trained weights, the embedded
SmolLM2-135M dequantised to float32 (its GGUF exported as a Hugging Face directory) with the same
last-token pooling and normalisation (its tokenizer has a chat template, so sentence-transformers
6 saves a "message" modality and both sides embed each sentence as a chat: SmolLM2's default
system message, then the sentence as the user's): random weights at a large initialisation amplify every
rounding through the layers, so this is the shape that says what a quantised path costs a trained
model. The sentences are `--words` random words each (31, plus the `<|endoftext|>` the word-level
tokenizer appends: 32 tokens; SmolLM2's own tokenizer gives about as many), `--sentences` of them
(64).

Each side embeds all sentences in one call, best of `--repeats` rounds (the two sides alternate
within a round) after a warm-up call: fastdeploy
`LLM(..., runner="pooling").embed(sentences)`, sentence-transformers
`encode(sentences, batch_size=len(sentences))`; both float32 on the CPU with `--threads` threads
(default: the cores this process may use). Prints each side's sentences/s, fastdeploy's speed over
sentence-transformers', and the largest cosine distance between the two sides' embeddings.

`--variant LABEL:KEY=VALUE,...` adds a fastdeploy row (FD_* keys are environment variables set
while its `LLM` is built and runs, others `LLM` arguments), e.g. `--variant bf16:dtype=bfloat16`
or `--variant int8:quantization=wint8,FD_CPU_ACTIVATIONS=int8` (int8 weights per output channel
times int8 activations: native/gemm_w8a8.c); its cosine distance to sentence-transformers' float32
embeddings says what the speed costs.

    python benchmarks/embeddings.py [--shape small|tiny] [--sentences 64] [--words 31] [--repeats 5]
        [--threads N] [--variant LABEL:KEY=VALUE,...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "models"))
import embedding_checkpoint  # noqa: E402
from throughput import variant_settings  # noqa: E402  (benchmarks/ is the script directory)

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
    "smollm2": {},
}


def best_seconds(runs: dict, repeats: int) -> dict:
    """Best wall seconds of each run over `repeats` rounds, the runs alternating within a round (a
    shared machine's load then weighs on both alike), after one warm-up call each."""
    for run in runs.values():
        run()  # warm-up: first-call allocations, kernel packing
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
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
    parser.add_argument("--variant", action="append", default=[], help="LABEL:KEY=VALUE,... (see above)")
    args = parser.parse_args()

    import torch  # after the arguments: --help needs no torch

    torch.set_num_threads(args.threads)
    vocabulary = embedding_checkpoint.vocabulary(SHAPES[args.shape].get("extra_words", 0))
    words = vocabulary[len(embedding_checkpoint.SPECIALS) :]
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, args.words)) for _ in range(args.sentences)]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model")
        if args.shape == "smollm2":
            reference = trained_checkpoint(path)
        else:
            reference = embedding_checkpoint.build(path, "lasttoken", True, **SHAPES[args.shape])
        # what sentence-transformers feeds the model: more than the words where the checkpoint
        # renders texts through a chat template (smollm2: SmolLM2's, with its system message)
        tokens = int(reference.preprocess(sentences)["attention_mask"].sum(1).max())
        runs, outputs = {}, {}
        for text in ["fastdeploy:", *args.variant]:
            label, _, options = variant_settings(text)
            env = {key: str(options.pop(key)) for key in list(options) if key.startswith("FD_")}
            with environment(env):
                llm = LLM(
                    path, runner="pooling", cpu_threads=args.threads, max_model_len=tokens + 8, **options
                )
            runs[label] = embedder(llm, sentences, env)
            outputs[label] = runs[label]()

        def theirs() -> np.ndarray:
            with torch.inference_mode():
                return reference.encode(sentences, batch_size=len(sentences), convert_to_numpy=True)

        expected = theirs()
        best = best_seconds({**runs, "sentence-transformers": theirs}, args.repeats)
    print(
        f"shape {args.shape}: {args.sentences} sentences of up to {tokens} tokens, {args.threads} threads, "
        f"best of {args.repeats}"
    )
    reference_s = best["sentence-transformers"]
    print(
        f"{'sentence-transformers':24} {args.sentences / reference_s:8.1f} sentences/s ({reference_s * 1e3:.1f} ms)"
    )
    for label, seconds in best.items():
        if label in runs:
            print(
                f"{label:24} {args.sentences / seconds:8.1f} sentences/s ({seconds * 1e3:.1f} ms), "
                f"{reference_s / seconds:.2f}x; largest cosine distance {cosine_distance(outputs[label], expected):.2e}"
            )


def trained_checkpoint(directory: str):
    """The embedded SmolLM2 as a sentence-transformers checkpoint (float32, last-token pooling,
    normalised) saved in `directory`; returns the SentenceTransformer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    from fastdeploy.model_executor.gguf_export import export_hf_directory
    from fastdeploy.model_resolver import embedded_model_path

    base = directory.rstrip("/") + "-base"
    export_hf_directory(embedded_model_path(), base)
    transformer = Transformer(base)
    if transformer.tokenizer.pad_token is None:  # batching pads; last-token pooling reads the mask
        transformer.tokenizer.pad_token = transformer.tokenizer.eos_token
    hidden = transformer.get_embedding_dimension()
    modules = [transformer, Pooling(hidden, pooling_mode="lasttoken"), Normalize()]
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(directory)
    return model


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """`env` set in os.environ meanwhile."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def embedder(llm, sentences: list[str], env: dict[str, str]):
    """A call embedding `sentences` with `llm` (under `env`), returning [sentences, hidden]."""

    def run() -> np.ndarray:
        with environment(env):
            return np.array([o.outputs.embedding for o in llm.embed(sentences, use_tqdm=False)])

    return run


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float((1 - (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).max())


if __name__ == "__main__":
    main()
