"""What the opt-in numerics cost in accuracy, against the exact float32 default, on SmolLM2.

For each variant (`LLM(...)` arguments) on a checkpoint, against float32 on the same checkpoint:
  * greedy agreement: 16 prompts x 64 greedy tokens; the mean share of positions whose token equals
    float32's, and the mean number of tokens before the first difference;
  * perplexity of tests/fixtures/perplexity_text.txt (one pass over the whole text).

The only SmolLM2 weights on these machines are the Q4_1 GGUF, so its float32 directory holds
values that already sit on a 4-bit grid, which wint4 re-quantises almost losslessly. `--jitter`
adds a second checkpoint that behaves like a genuinely float model: every weight moved uniformly
within its own Q4_1 cell (+-half a step), so quantising it again costs what quantising a float
model costs.

    python benchmarks/accuracy.py [--variant LABEL:KEY=VALUE,...] [--jitter] [--tokens 64] [--prompts 16]
                                  [--gguf PATH]

Default variants: wint8, wint4 on the float32 directory, and the Q4_1 GGUF itself. A variant's
FD_* settings (e.g. FD_CPU_ACTIVATIONS=int8) are set in the environment while its engine starts;
`--gguf` takes another SmolLM2 GGUF (a Q4_K_M file) and its float32 export as the reference.

`--device cuda` runs every engine on the GPU in `--dtype` (bfloat16 by default), so the reference
is the bf16 model and the variants are the cuda backend's packed weights: wint8, wint4 (groups of
64: SmolLM2's hidden size 576 is not a multiple of 128), fp8 where the GPU has FP8 tensor cores,
and the Q4_1 GGUF (dequantised at load: Q4_1 has no block kernel there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from typing import Any

import numpy as np
from throughput import variant_settings  # benchmarks/ is the script directory

TEXT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "perplexity_text.txt"
)
DEFAULT_VARIANTS = ["wint8:quantization=wint8", "wint4:quantization=wint4", "gguf-q4_1:checkpoint=gguf"]
CUDA_VARIANTS = [
    "wint8:quantization=wint8",
    "wint4-g64:quantization=wint4,quantization_group_size=64",
    "fp8:quantization=fp8",
    "gguf-q4_1:checkpoint=gguf",
]
TOPICS = [
    "the history of the printing press",
    "how rivers shape valleys",
    "why the sky is blue",
    "the rules of chess",
    "how bread is baked",
    "the water cycle",
    "the life of bees",
    "how a bicycle works",
    "the first airplanes",
    "why leaves change colour in autumn",
    "how vaccines work",
    "the planets of the solar system",
    "how to plant a tree",
    "the invention of the telephone",
    "how glass is made",
    "the migration of birds",
]


def prompt_logprobs(llm: Any, token_ids: list[int]) -> np.ndarray:
    """log p(token_i | tokens before it) for i >= 1, from one forward pass over a scratch KV cache
    (the engine's own cache and prefix cache are not touched)."""
    from fastdeploy.backends.base import BatchLayout

    engine = llm.llm_engine
    backend, model = engine.backend, engine.model
    block = engine.block_manager.block_size
    count = len(token_ids)
    blocks = -(-count // block)
    caches = backend.allocate_kv_cache(dataclasses.replace(engine.kv_cache_spec, num_blocks=blocks))
    positions = np.arange(count, dtype=np.int64)
    layout = BatchLayout(
        input_ids=np.asarray(token_ids, np.int64),
        positions=positions,
        slot_mapping=positions.copy(),
        query_lens=np.array([count], np.int64),
        context_lens=np.array([count], np.int64),
        block_tables=np.arange(blocks, dtype=np.int64)[None, :],
        logits_indices=positions,
        block_size=block,
    )
    hidden = model.forward(
        backend.from_numpy(layout.input_ids),
        backend.from_numpy(positions),
        backend.prepare_batch(layout),
        caches,
    )
    logits = backend.to_numpy(model.compute_logits(hidden)).astype(np.float64)[:-1]
    logits -= logits.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(logits).sum(axis=-1))
    return logits[np.arange(count - 1), token_ids[1:]] - log_norm


def perplexity(llm: Any, text: str) -> float:
    ids = llm.get_tokenizer().encode(text, add_special_tokens=False)
    return float(np.exp(-prompt_logprobs(llm, ids).mean()))


def greedy(llm: Any, prompts: list[str], tokens: int) -> list[list[int]]:
    from fastdeploy import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    conversations = [[{"role": "user", "content": f"Write a short paragraph about {p}."}] for p in prompts]
    return [list(o.outputs.token_ids) for o in llm.chat(conversations, params, use_tqdm=False)]


def agreement(reference: list[list[int]], tokens: list[list[int]]) -> tuple[float, float]:
    """(share of equal positions, mean tokens before the first difference)."""
    pairs = [(np.asarray(r), np.asarray(t)) for r, t in zip(reference, tokens, strict=True)]
    same = [np.mean(r == t) for r, t in pairs]
    prefixes = [int(np.argmin(r == t)) if (r != t).any() else len(r) for r, t in pairs]
    return float(np.mean(same)), float(np.mean(prefixes))


def jitter_checkpoint(source: str, target: str, seed: int = 0) -> None:
    """Copy an HF directory with every linear weight moved uniformly within its Q4_1 cell."""
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, target, dirs_exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = load_file(os.path.join(source, "model.safetensors"))
    for name, value in tensors.items():
        if value.ndim == 2 and value.shape[1] % 32 == 0:
            blocks = value.reshape(value.shape[0], -1, 32)
            step = (blocks.max(axis=-1, keepdims=True) - blocks.min(axis=-1, keepdims=True)) / 15
            noise = rng.uniform(-0.5, 0.5, blocks.shape).astype(np.float32) * step
            tensors[name] = (blocks + noise).reshape(value.shape).astype(np.float32)
    save_file(tensors, os.path.join(target, "model.safetensors"))


def evaluate(args: argparse.Namespace, name: str, models: dict[str, str], text: str) -> list[dict]:
    from fastdeploy import LLM

    prompts = TOPICS[: args.prompts]
    device = {"device": args.device, "dtype": args.dtype} if args.device != "cpu" else {}
    reference_llm = LLM(model=models["safetensors"], max_model_len=2048, **device)
    reference = greedy(reference_llm, prompts, args.tokens)
    baseline = args.dtype if args.device != "cpu" else "float32"
    rows = [{"checkpoint": name, "variant": baseline, "ppl": perplexity(reference_llm, text), "same": 1.0}]
    rows[0]["prefix"] = float(args.tokens)
    del reference_llm
    defaults = CUDA_VARIANTS if args.device == "cuda" else DEFAULT_VARIANTS
    for label, checkpoint, options in map(variant_settings, args.variant or defaults):
        if checkpoint == "gguf" and name != "SmolLM2":
            continue  # the jittered model has no GGUF
        env = {key: str(options.pop(key)) for key in list(options) if key.startswith("FD_")}
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)  # FD_* settings are read as the engine starts
        try:
            llm = LLM(model=models[checkpoint or "safetensors"], max_model_len=2048, **device, **options)
        except Exception as exc:  # fp8 on a GPU without FP8 tensor cores: refused, and said why
            print(f"{name} {label}: not run: {exc}", flush=True)
            continue
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        same, prefix = agreement(reference, greedy(llm, prompts, args.tokens))
        rows.append(
            {
                "checkpoint": name,
                "variant": label,
                "ppl": perplexity(llm, text),
                "same": same,
                "prefix": prefix,
            }
        )
        del llm
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", action="append", default=[], help="LABEL:KEY=VALUE,... LLM arguments")
    parser.add_argument("--jitter", action="store_true", help="also a genuinely float copy of the model")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--gguf", metavar="PATH", help="a SmolLM2 GGUF file instead of the embedded Q4_1 one (e.g. Q4_K_M)"
    )
    parser.add_argument("--device", default="cpu", help="cpu (float32 reference) or cuda (--dtype reference)")
    parser.add_argument(
        "--dtype", default="bfloat16", help="--device cuda: the reference's and variants' dtype"
    )
    args = parser.parse_args()
    os.environ.setdefault("FD_LOG_LEVEL", "WARNING")
    from fastdeploy.model_executor.gguf_export import export_hf_directory
    from fastdeploy.model_resolver import embedded_model_path

    with open(TEXT, encoding="utf-8") as handle:
        text = handle.read()
    gguf = args.gguf or embedded_model_path()
    rows = []
    with tempfile.TemporaryDirectory(prefix="smollm2-accuracy-") as directory:
        float_dir = os.path.join(directory, "float32")
        export_hf_directory(gguf, float_dir)
        rows += evaluate(args, "SmolLM2", {"gguf": gguf, "safetensors": float_dir}, text)
        if args.jitter:
            jittered = os.path.join(directory, "jittered")
            jitter_checkpoint(float_dir, jittered)
            rows += evaluate(args, "SmolLM2 jittered", {"safetensors": jittered}, text)
    baseline = args.dtype if args.device != "cpu" else "float32"
    print(
        f"\n{args.prompts} prompts x {args.tokens} greedy tokens against {baseline} on the same checkpoint;"
    )
    print("perplexity of tests/fixtures/perplexity_text.txt\n")
    print(
        f"{'checkpoint':<18} {'variant':<22} {'same tokens':>11} {'tokens to 1st diff':>19} {'perplexity':>11}"
    )
    for row in rows:
        print(
            f"{row['checkpoint']:<18} {row['variant']:<22} {row['same']:11.1%} {row['prefix']:19.1f} {row['ppl']:11.3f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
