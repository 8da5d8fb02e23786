"""Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`) against transformers: the processor's pixels
against `Qwen2VLImageProcessorPil`, and 24 greedy tokens against transformers' float32 model on a
tiny random checkpoint the test writes with transformers itself (text-only, one-image and
two-image prompts; offline `LLM.generate` / `LLM.chat` and the OpenAI server)."""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

# torch may import triton, which reads this once: other test modules of this process run the cuda
# backend's Triton kernels interpreted on the CPU
os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("PIL")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints" / "openai"))
import mrope_vl_reference  # noqa: E402
import tiny_checkpoints  # noqa: E402
from mrope_vl_reference import IMAGES, open_images  # noqa: E402
from PIL import Image  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402

import fastdeploy.models.qwen2_5_vl.plugin as qwen_vl_plugin  # noqa: E402
from fastdeploy import LLM, SamplingParams  # noqa: E402
from fastdeploy.input.family_templates import QWEN_VL_CHAT_TEMPLATE  # noqa: E402
from fastdeploy.input.multimodal.image_processor import PatchSettings  # noqa: E402
from fastdeploy.input.multimodal.qwen2_5_vl import preprocess_image  # noqa: E402
from fastdeploy.plugins.registry import get_registry  # noqa: E402

VOCAB = tiny_checkpoints.CHAT_VOCAB_SIZE
IM_START, IM_END = (
    tiny_checkpoints.added_token_id("<|im_start|>"),
    tiny_checkpoints.added_token_id("<|im_end|>"),
)
VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
FIRST_VL = tiny_checkpoints.FIRST_ADDED_ID + len(tiny_checkpoints.ERNIE_ADDED_TOKENS)
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = range(FIRST_VL, FIRST_VL + 4)
NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
#: one image spans two attention windows (8x12 patches of 14 pixels; windows are 8x8 patches)
PROMPTS = {
    "text": {"ids": [IM_START, 17, 42, 99, 5, 63, 120, 2001, 9], "images": []},
    "one_image": {
        "ids": [IM_START, 17, 42, VISION_START, IMAGE_PAD, VISION_END, 63, 120, 2001],
        "images": ["chelsea_180x120.png"],
    },
    "two_images": {
        "ids": [IM_START, 7, VISION_START, IMAGE_PAD, VISION_END, 88, VISION_START, IMAGE_PAD, VISION_END, 3],
        "images": ["astronaut_211x130.jpg", "rocket_90x200.png"],
    },
}


def hf_config() -> transformers.Qwen2_5_VLConfig:
    text = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": 4,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "fullatt_block_indexes": [1, 3],
        "window_size": 112,
    }
    return transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_PAD,
        video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        tie_word_embeddings=False,
    )


def write_tokenizer(directory: Path) -> None:
    """The tiny SentencePiece tokenizer plus Qwen2.5-VL's vision tokens and chat template."""
    tiny_checkpoints.write_ernie_tokenizer(directory, QWEN_VL_CHAT_TEMPLATE)
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    for offset, text in enumerate(VL_TOKENS):
        config["added_tokens_decoder"][str(FIRST_VL + offset)] = {
            "content": text,
            "special": True,
            "normalized": False,
        }
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")


@pytest.fixture(scope="module")
def registered():
    registry = get_registry()
    if "Qwen2_5_VLForConditionalGeneration" not in registry.model_architectures():
        registry.register(qwen_vl_plugin, name="fastdeploy.qwen_vl")
    return registry


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, transformers model) of the tiny random checkpoint."""
    directory = tmp_path_factory.mktemp("qwen2_5_vl")
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(hf_config()).float().eval()
    with torch.no_grad():  # larger weights than the init's, so greedy choices are far from ties
        for parameter in model.parameters():
            if parameter.ndim >= 2:
                parameter.normal_(0.0, 0.15)
    model.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory)
    return str(directory), model


@pytest.fixture(scope="module")
def llm(checkpoint, registered) -> LLM:
    return LLM(model=checkpoint[0], max_model_len=512, limit_mm_per_prompt={"image": 2})


def reference_pixels(images: list) -> tuple[np.ndarray | None, np.ndarray | None]:
    if not images:
        return None, None
    out = Qwen2VLImageProcessorPil()(images=images, return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"]


def transformers_greedy(model, ids: list[int], images: list) -> list[int]:
    """transformers' greedy tokens; the placeholders expanded from its own processor's grids."""
    return mrope_vl_reference.transformers_greedy(
        model, ids, *reference_pixels(images), IMAGE_PAD, NEW_TOKENS
    )


@pytest.mark.parametrize(
    "size,bounds",
    [
        ((180, 120), {}),
        ((37, 500), {}),
        ((1200, 900), {}),
        ((300, 200), {"min_pixels": 56 * 56 * 20, "max_pixels": 28 * 28 * 60}),
        ((20, 20), {}),
    ],
)
def test_pixels_equal_the_reference_processor(size, bounds):
    rng = np.random.default_rng(sum(size))
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    settings = PatchSettings(
        min_pixels=bounds.get("min_pixels", 56 * 56), max_pixels=bounds.get("max_pixels", 28 * 28 * 1280)
    )
    patches, grid = preprocess_image(image, settings)
    size_kwargs = {"size": {"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels}}
    reference = Qwen2VLImageProcessorPil(**size_kwargs)(images=[image], return_tensors="np")
    assert list(grid) == reference["image_grid_thw"][0].tolist()
    assert patches.shape == reference["pixel_values"].shape
    np.testing.assert_allclose(patches, reference["pixel_values"], atol=1e-6, rtol=0)


def test_fixture_photos_equal_the_reference_processor():
    for image in open_images(["astronaut_211x130.jpg", "coffee_250x97.png", "rocket_90x200.png"]):
        patches, grid = preprocess_image(image, PatchSettings(min_pixels=56 * 56, max_pixels=28 * 28 * 1280))
        pixels, grids = reference_pixels([image])
        assert list(grid) == grids[0].tolist()
        np.testing.assert_allclose(patches, pixels, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_tokens_equal_transformers(name, llm, expected):
    output = llm.generate([generate_prompt(name)], GREEDY, use_tqdm=False)[0]
    assert output.error_code == 200, output.error_msg
    assert output.outputs.token_ids == expected[name]


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()


def chat(*names: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(name)}} for name in names]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in the picture?"}]}]


def chat_reference(llm: LLM, model, names: list[str]) -> tuple[str, list[int]]:
    """The rendered chat prompt and transformers' greedy tokens for it."""
    prompt = llm.get_tokenizer().apply_chat_template(chat(*names), tokenize=False, add_generation_prompt=True)
    assert prompt.count("<|vision_start|><|image_pad|><|vision_end|>") == len(names)
    ids = llm.get_tokenizer().encode(prompt, add_special_tokens=False)
    return prompt, transformers_greedy(model, ids, open_images(names))


def test_chat_with_image_url_parts_equals_transformers(llm, checkpoint):
    names = ["chelsea_180x120.png", "rocket_90x200.png"]
    prompt, expected = chat_reference(llm, checkpoint[1], names)
    output = llm.chat(chat(*names), GREEDY, use_tqdm=False)[0]
    assert output.error_code == 200, output.error_msg
    assert output.prompt == prompt
    assert output.outputs.token_ids == expected


def test_videos_are_refused_naming_the_part(llm):
    frames = [np.zeros((56, 56, 3), dtype=np.uint8)] * 4
    prompt = {
        "prompt_token_ids": [IM_START, VISION_START, VIDEO_PAD, VISION_END, 5],
        "multimodal_data": {"video": [frames]},
    }
    output = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert output.error_code == 400
    assert "videos are not supported for Qwen2.5-VL" in output.error_msg


def test_placeholder_count_mismatch_is_a_clear_error(llm):
    prompt = {
        "prompt_token_ids": [IM_START, 5, 6],
        "multimodal_data": {"image": open_images(["chelsea_180x120.png"])},
    }
    output = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert output.error_code == 400
    assert "0 image placeholder(s) but 1 image(s)" in output.error_msg


def test_openai_server_chat_with_an_image_data_url(checkpoint, registered, llm):
    openai = pytest.importorskip("openai")
    uvicorn = pytest.importorskip("uvicorn")
    from openai_server_helpers import HOST, free_port, wait_until

    from fastdeploy.entrypoints.openai.api_server import build_context
    from fastdeploy.entrypoints.openai.app import build_app
    from fastdeploy.entrypoints.openai.cli_args import build_parser

    names = ["chelsea_180x120.png"]
    _, expected = chat_reference(llm, checkpoint[1], names)
    args = build_parser("test").parse_args(["--model", checkpoint[0], "--max-model-len", "512"])
    ctx = build_context(args)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(ctx), host=HOST, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 120, "the in-process server")
        client = openai.OpenAI(
            base_url=f"http://{HOST}:{port}/v1", api_key="unused", max_retries=0, timeout=120
        )
        reply = client.chat.completions.create(
            model=ctx.served_model_names[0],
            messages=chat(*names),
            max_tokens=NEW_TOKENS,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        tokenizer = llm.get_tokenizer()
        assert reply.choices[0].message.content == tokenizer.decode(expected, skip_special_tokens=True)
        assert reply.usage.completion_tokens == NEW_TOKENS
    finally:
        server.should_exit = True
        thread.join(60)


@pytest.fixture(scope="module")
def expected(checkpoint) -> dict[str, list[int]]:
    """transformers' greedy tokens of each prompt of PROMPTS (computed once)."""
    model = checkpoint[1]
    return {
        name: transformers_greedy(model, case["ids"], open_images(case["images"]))
        for name, case in PROMPTS.items()
    }


def generate_prompt(name: str) -> dict:
    case = PROMPTS[name]
    prompt = {"prompt_token_ids": case["ids"]}
    if case["images"]:
        prompt["multimodal_data"] = {"image": open_images(case["images"])}
    return prompt


def test_the_other_layout_loads_the_same_model(checkpoint, registered, expected, tmp_path):
    """transformers 5's in-memory names (`model.language_model.*`, `model.visual.*`) and the hub's
    flat config.json (text fields at the top, `rope_scaling` of type "mrope")."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(Path(checkpoint[0]) / "model.safetensors"))
    renamed = {}
    for name, array in tensors.items():
        if name.startswith("visual."):
            name = "model." + name
        elif name.startswith("model."):
            name = "model.language_model." + name[len("model.") :]
        renamed[name] = array
    save_file(renamed, str(tmp_path / "model.safetensors"))
    nested = json.loads((Path(checkpoint[0]) / "config.json").read_text(encoding="utf-8"))
    text = nested.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**nested, **text, "rope_theta": rope["rope_theta"]}
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    (tmp_path / "config.json").write_text(json.dumps(flat), encoding="utf-8")
    write_tokenizer(tmp_path)
    llm = LLM(model=str(tmp_path), max_model_len=256)
    outputs = llm.generate([generate_prompt("one_image"), generate_prompt("text")], GREEDY, use_tqdm=False)
    assert [output.outputs.token_ids for output in outputs] == [expected["one_image"], expected["text"]]


def test_chunked_prefill_splits_images_and_keeps_the_tokens(checkpoint, registered, expected):
    """A 16-token budget splits both images of the two-image prompt across several passes."""
    llm = LLM(model=checkpoint[0], max_model_len=256, max_num_batched_tokens=16)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, n=2)
    output = llm.generate(generate_prompt("two_images"), params, use_tqdm=False)[0]
    assert [sample.token_ids for sample in output.outputs] == [expected["two_images"]] * 2


def test_prefix_cache_keys_include_the_image(checkpoint, registered, expected):
    """Prompts that differ only in the image have equal token ids but must not share blocks."""
    llm = LLM(model=checkpoint[0], max_model_len=256, block_size=16, enable_prefix_caching=True)
    first = llm.generate(generate_prompt("one_image"), GREEDY, use_tqdm=False)[0]
    same = llm.generate(generate_prompt("one_image"), GREEDY, use_tqdm=False)[0]
    flipped = dict(
        generate_prompt("one_image"),
        multimodal_data={"image": [open_images(["chelsea_180x120.png"])[0].transpose(0)]},
    )
    different = llm.generate(flipped, GREEDY, use_tqdm=False)[0]
    assert (
        same.num_cached_tokens == 16
        and same.outputs.token_ids == first.outputs.token_ids == expected["one_image"]
    )
    assert different.num_cached_tokens == 0
    reference = transformers_greedy(
        checkpoint[1], PROMPTS["one_image"]["ids"], [open_images(["chelsea_180x120.png"])[0].transpose(0)]
    )
    assert different.outputs.token_ids == reference


@pytest.mark.parametrize("device", ["torch-cpu", "paddle-cpu"])
def test_the_cuda_backends_code_generates_the_same_tokens(device, checkpoint, registered, expected):
    """The cuda backend's own code (its CPU twins) runs the vision tower and M-RoPE language model."""
    pytest.importorskip(device.split("-")[0], reason=f"the {device} backend needs {device.split('-')[0]}")
    llm = LLM(model=checkpoint[0], device=device, max_model_len=256)
    outputs = llm.generate([generate_prompt("two_images"), generate_prompt("text")], GREEDY, use_tqdm=False)
    assert [output.outputs.token_ids for output in outputs] == [expected["two_images"], expected["text"]]
