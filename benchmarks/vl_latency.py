"""ERNIE-4.5-VL on one image: fastdeploy against transformers in the same run, plus batched chats.

For each random-weight config (`tiny`: the test model; `mid`: hidden 512, 6 layers, a 6-block
512-wide vision tower), the script writes a -PT checkpoint, then measures, greedy with EOS ignored:

  * image encoding: vision tower + resampler for one 448x448 image (1024 patches -> 256 tokens),
    best of 5 (fastdeploy: `VisionEncoder.encode`; transformers: `get_image_features`);
  * end-to-end latency: processing, prefill and 64 output tokens for one prompt with that image
    (fastdeploy: `LLM.generate` with `multimodal_data`; transformers: its processor + `generate`);
  * fastdeploy's output tokens/s for 8 concurrent chats, each with its own image.

`--variant LABEL:KEY=VALUE,...` adds a fastdeploy row (FD_* keys are environment variables set
while its `LLM` is built, others `LLM` arguments), e.g. `--variant bf16:FD_CPU_VISION_MATMUL=bfloat16`,
and prints its accuracy against the default row: the encoder output's max and mean relative error
(max |a - b| / max |b|, mean |a - b| / mean |b|) and how many of the latency run's greedy tokens
are the same. transformers runs in this process when installed
(`pip install torch==2.13.0 transformers==5.23.0`), once per `--peer-dtypes` entry (default
float32; `float32,bfloat16` adds torch's bfloat16 run); ratios are fastdeploy's speed over
transformers'. Threads: both use `--threads` (default: the cores this process may use).
`--device cuda` runs fastdeploy's cuda backend (float32; `--variant bf16:dtype=bfloat16` adds
bfloat16) and transformers on the same GPU.

    python benchmarks/vl_latency.py [--configs tiny,mid] [--new-tokens 64] [--skip-peer]
        [--variant LABEL:KEY=VALUE,...] [--peer-dtypes float32,bfloat16] [--device cuda]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "models"))
import tiny_checkpoints  # noqa: E402
import tiny_vl_checkpoint as tiny  # noqa: E402
from throughput import variant_settings  # noqa: E402  (benchmarks/ is the script directory)

IMAGE_SIDE = 448


def mid_config() -> dict:
    config = copy.deepcopy(tiny.CONFIG)
    config["text_config"].update(
        vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, moe_intermediate_size=[512, 256], moe_num_experts=8, moe_k=2,
        mlp_layer_types=["dense"] + ["sparse"] * 5, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [11, 11, 10]},
    )  # fmt: skip
    config["vision_config"].update(depth=6, hidden_size=512, intermediate_size=2048, num_heads=8)
    return config


CONFIGS = {"tiny": lambda: tiny.CONFIG, "mid": mid_config}


def photo(seed: int) -> object:
    """A 448x448 crop of a real photograph (tests/fixtures/images), shifted per seed."""
    from PIL import Image

    source = Image.open(REPO / "tests" / "fixtures" / "images" / "chelsea_180x120.png").convert("RGB")
    big = source.resize((IMAGE_SIDE + 64, IMAGE_SIDE + 64), Image.Resampling.BICUBIC)
    return big.crop((seed % 64, seed % 32, seed % 64 + IMAGE_SIDE, seed % 32 + IMAGE_SIDE))


def best_of(runs: int, fn) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


PROMPT = [1, 17, 42, tiny.IMAGE_START, tiny.IMAGE_TOKEN, tiny.IMAGE_END, 99, 5, 63]


def ours(directory: str, new_tokens: int, threads: int, device: str, options: dict) -> dict:
    """fastdeploy's figures, its encoder output and greedy tokens; FD_* `options` are set in the
    environment while the `LLM` is built (the backend reads them there), the rest passed to it
    (after `device`'s defaults: float32)."""
    import numpy as np

    from fastdeploy import LLM, SamplingParams

    env = {key: str(value) for key, value in options.items() if key.startswith("FD_")}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        llm = LLM(
            model=directory,
            max_model_len=1024,
            cpu_threads=threads,
            **{"device": device, "dtype": "float32", **{k: v for k, v in options.items() if k not in env}},
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    image = photo(0)
    prompt = engine.input_processor.mm_processor.process(PROMPT, [image])
    item = prompt.items[0]
    # the copy to the host waits for a device's queued kernels (a few hundred KB; free on the cpu)
    embeddings = engine.backend.to_numpy(engine.model.vision.encode(item.patches, item.grid_thw))
    encode = best_of(
        5, lambda: engine.backend.to_numpy(engine.model.vision.encode(item.patches, item.grid_thw))
    )
    request = {"prompt_token_ids": PROMPT, "multimodal_data": {"image": [image]}}
    llm.generate(request, params, use_tqdm=False)  # warm-up
    tokens = []
    latency = best_of(
        2, lambda: tokens.append(llm.generate(request, params, use_tqdm=False)[0].outputs.token_ids)
    )
    batch = [{"prompt_token_ids": PROMPT, "multimodal_data": {"image": [photo(i + 1)]}} for i in range(8)]
    start = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(output.outputs.token_ids) for output in outputs)
    return {
        "encode": encode,
        "latency": latency,
        "batch_tok_s": generated / elapsed,
        "embeddings": np.array(embeddings, dtype=np.float64),
        "tokens": list(tokens[-1]),
    }


def peer(directory: str, new_tokens: int, threads: int, dtype: str, device: str) -> dict[str, float] | None:
    """transformers on the same device ("cuda" for ours on cuda, else the host)."""
    try:
        import torch
        import transformers
        from transformers import Ernie4_5_VLMoeForConditionalGeneration
    except ImportError:
        return None
    processor_class = getattr(transformers, "Ernie4_5_VLMoeImageProcessorPil", None)
    processor_class = processor_class or transformers.Ernie4_5_VLMoeImageProcessor  # before 5.23
    torch.set_num_threads(threads)
    place = "cuda" if device == "cuda" else "cpu"
    model = (
        Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(directory, dtype=getattr(torch, dtype))
        .eval()
        .to(place)
    )
    processor = processor_class()

    def finished() -> None:
        if place == "cuda":
            torch.cuda.synchronize()

    image = photo(0)

    def inputs() -> dict:
        pixels = processor(images=[image], return_tensors="pt")
        grid = pixels["image_grid_thw"][0].tolist()
        count = grid[0] * grid[1] * grid[2] // 4
        ids = []
        for token in PROMPT:
            ids.extend([token] * count if token == tiny.IMAGE_TOKEN else [token])
        tensor = torch.tensor([ids])
        types = (tensor == tiny.IMAGE_TOKEN).long()
        moe = types.clone()
        moe[(tensor == tiny.IMAGE_START) | (tensor == tiny.IMAGE_END)] = 1
        named = dict(input_ids=tensor, mm_token_type_ids=types, moe_mm_token_type_ids=moe, **pixels)
        return {key: value.to(place) for key, value in named.items()}

    features = inputs()
    with torch.no_grad():
        encode = best_of(
            5,
            lambda: (
                model.get_image_features(features["pixel_values"], features["image_grid_thw"]),
                finished(),
            ),
        )

    def generate() -> None:
        with torch.no_grad():
            model.generate(**inputs(), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        finished()

    generate()
    latency = best_of(2, generate)
    return {"encode": encode, "latency": latency}


def accuracy(variant: dict, default: dict) -> str:
    """A variant's encoder output and greedy tokens against the default (float32) row's."""
    ours, exact = variant["embeddings"], default["embeddings"]
    difference = abs(ours - exact)
    same = sum(a == b for a, b in zip(variant["tokens"], default["tokens"], strict=True))
    return (
        f"encoder output max rel. error {difference.max() / abs(exact).max():.2e}, "
        f"mean {difference.mean() / abs(exact).mean():.2e}; greedy tokens {same}/{len(default['tokens'])} same"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="tiny,mid")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument(
        "--variant", action="append", default=[], help="LABEL:KEY=VALUE,... an extra fastdeploy row"
    )
    parser.add_argument("--peer-dtypes", default="float32", help="transformers' dtypes, comma-separated")
    parser.add_argument(
        "--device", default="cpu", help="fastdeploy's device; on cuda transformers runs there too"
    )
    args = parser.parse_args()
    variants = [("fastdeploy", {})] + [
        (f"fastdeploy {label}", options) for label, _, options in map(variant_settings, args.variant)
    ]
    dtypes = [] if args.skip_peer else [dtype for dtype in args.peer_dtypes.split(",") if dtype]
    rows = []
    for name in args.configs.split(","):
        with tempfile.TemporaryDirectory() as directory:
            tiny.write_checkpoint(directory, "pt", CONFIGS[name]())
            tiny_checkpoints.write_ernie_tokenizer(directory)
            mine = {
                label: ours(directory, args.new_tokens, args.threads, args.device, options)
                for label, options in variants
            }
            theirs = {
                f"transformers {dtype}": peer(directory, args.new_tokens, args.threads, dtype, args.device)
                for dtype in dtypes
            }
        rows.append(
            (name, mine, {label: figures for label, figures in theirs.items() if figures is not None})
        )
    print(
        f"one {IMAGE_SIDE}x{IMAGE_SIDE} image, {args.new_tokens} output tokens, device {args.device}, "
        f"{args.threads} threads"
    )
    for name, mine, theirs in rows:
        engines = {**mine, **theirs}
        print(f"\n{name}: " + " | ".join(engines))
        for key, label in (("encode", "image encoding"), ("latency", "end-to-end latency")):
            times = " | ".join(f"{figures[key] * 1000:.1f} ms" for figures in engines.values())
            print(f"  {label:20} {times}")
            for ours_label, figures in mine.items():
                for their_label, peer_figures in theirs.items():
                    ratio = peer_figures[key] / figures[key]
                    print(f"    {ours_label} vs {their_label}: {ratio:.2f}x")
        for label, figures in mine.items():
            print(f"  8 image chats, {label}: {figures['batch_tok_s']:.1f} tok/s")
        for label, figures in list(mine.items())[1:]:
            print(f"  accuracy, {label} vs fastdeploy: {accuracy(figures, mine['fastdeploy'])}")


if __name__ == "__main__":
    main()
