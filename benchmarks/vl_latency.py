"""ERNIE-4.5-VL on one image: fastdeploy against transformers in the same run, plus batched chats.

For each random-weight config (`tiny`: the test model; `mid`: hidden 512, 6 layers, a 6-block
512-wide vision tower), the script writes a -PT checkpoint, then measures, greedy with EOS ignored:

  * image encoding: vision tower + resampler for one 448x448 image (1024 patches -> 256 tokens),
    best of 3 (fastdeploy: `VisionEncoder.encode`; transformers: `get_image_features`);
  * end-to-end latency: processing, prefill and 64 output tokens for one prompt with that image
    (fastdeploy: `LLM.generate` with `multimodal_data`; transformers: its processor + `generate`);
  * fastdeploy's output tokens/s for 8 concurrent chats, each with its own image.

transformers (float32) runs in this process when installed
(`pip install torch==2.13.0 transformers==5.23.0`); ratios are fastdeploy's speed over
transformers'. Threads: both use `--threads` (default: the cores this process may use).

    python benchmarks/vl_latency.py [--configs tiny,mid] [--new-tokens 64] [--skip-peer]
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


def ours(directory: str, new_tokens: int, threads: int) -> dict[str, float]:
    from fastdeploy import LLM, SamplingParams

    llm = LLM(model=directory, max_model_len=1024, cpu_threads=threads)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    image = photo(0)
    prompt = engine.mm_processor.process(PROMPT, [image])
    item = prompt.items[0]
    encode = best_of(3, lambda: engine.model.vision.encode(item.patches, item.grid_thw))
    request = {"prompt_token_ids": PROMPT, "multimodal_data": {"image": [image]}}
    llm.generate(request, params, use_tqdm=False)  # warm-up
    latency = best_of(2, lambda: llm.generate(request, params, use_tqdm=False))
    batch = [{"prompt_token_ids": PROMPT, "multimodal_data": {"image": [photo(i + 1)]}} for i in range(8)]
    start = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(output.outputs.token_ids) for output in outputs)
    return {"encode": encode, "latency": latency, "batch_tok_s": generated / elapsed}


def peer(directory: str, new_tokens: int, threads: int) -> dict[str, float] | None:
    try:
        import torch
        from transformers import Ernie4_5_VLMoeForConditionalGeneration, Ernie4_5_VLMoeImageProcessorPil
    except ImportError:
        return None
    torch.set_num_threads(threads)
    model = Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = Ernie4_5_VLMoeImageProcessorPil()
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
        return dict(input_ids=tensor, mm_token_type_ids=types, moe_mm_token_type_ids=moe, **pixels)

    features = inputs()
    with torch.no_grad():
        encode = best_of(
            3, lambda: model.get_image_features(features["pixel_values"], features["image_grid_thw"])
        )

    def generate() -> None:
        with torch.no_grad():
            model.generate(**inputs(), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

    generate()
    latency = best_of(2, generate)
    return {"encode": encode, "latency": latency}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="tiny,mid")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--skip-peer", action="store_true")
    args = parser.parse_args()
    rows = []
    for name in args.configs.split(","):
        with tempfile.TemporaryDirectory() as directory:
            tiny.write_checkpoint(directory, "pt", CONFIGS[name]())
            tiny_checkpoints.write_ernie_tokenizer(directory)
            mine = ours(directory, args.new_tokens, args.threads)
            theirs = None if args.skip_peer else peer(directory, args.new_tokens, args.threads)
        rows.append((name, mine, theirs))
    print(
        f"one {IMAGE_SIDE}x{IMAGE_SIDE} image, {args.new_tokens} output tokens, {args.threads} threads, float32"
    )
    print(f"{'config':6} {'figure':26} {'fastdeploy':>12} {'transformers':>13} {'speed-up':>9}")
    for name, mine, theirs in rows:
        for key, label, unit in (("encode", "image encoding", "ms"), ("latency", "end-to-end latency", "ms")):
            ours_ms = mine[key] * 1000
            line = f"{name:6} {label:26} {ours_ms:10.1f}{unit}"
            if theirs is not None:
                line += f" {theirs[key] * 1000:11.1f}{unit} {theirs[key] / mine[key]:8.2f}x"
            print(line)
        print(f"{name:6} {'8 image chats, tok/s':26} {mine['batch_tok_s']:12.1f}")


if __name__ == "__main__":
    main()
