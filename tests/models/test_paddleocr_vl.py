"""PaddleOCR-VL (`PaddleOCRVLForConditionalGeneration`) against transformers: the processor's pixels
against `PaddleOCRVLImageProcessorPil`, and 24 greedy tokens against transformers' float32 model on
a tiny random checkpoint the test writes with transformers itself (text-only, one-image and
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
pytest.importorskip("transformers.models.paddleocr_vl", reason="transformers has no PaddleOCR-VL")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints" / "openai"))
import mrope_vl_reference  # noqa: E402
import tiny_checkpoints  # noqa: E402
from mrope_vl_reference import IMAGES, open_images  # noqa: E402
from PIL import Image  # noqa: E402
from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import (  # noqa: E402
    PaddleOCRVLImageProcessorPil,
)

import fastdeploy.models.paddleocr_vl.plugin as paddleocr_vl_plugin  # noqa: E402
from fastdeploy import LLM, SamplingParams  # noqa: E402
from fastdeploy.errors import InvalidArgumentError  # noqa: E402
from fastdeploy.input.family_templates import PADDLEOCR_VL_CHAT_TEMPLATE  # noqa: E402
from fastdeploy.input.multimodal.paddleocr_vl import image_settings, preprocess_image  # noqa: E402
from fastdeploy.models.paddleocr_vl.vision import bilinear_matrix  # noqa: E402
from fastdeploy.plugins.registry import get_registry  # noqa: E402

VOCAB = tiny_checkpoints.CHAT_VOCAB_SIZE
BOS = tiny_checkpoints.added_token_id("<|begin_of_sentence|>")
VL_TOKENS = ["<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>", "<|VIDEO_PLACEHOLDER|>"]
FIRST_VL = tiny_checkpoints.FIRST_ADDED_ID + len(tiny_checkpoints.ERNIE_ADDED_TOKENS)
IMAGE_START, IMAGE_END, IMAGE_PAD, VIDEO_PAD = range(FIRST_VL, FIRST_VL + 4)
NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
#: the checkpoint's preprocessor_config.json: PaddleOCR-VL's own mean/std (not CLIP's) and
#: bounds small enough for a quick test
PREPROCESSOR = {
    "image_mean": [0.5] * 3,
    "image_std": [0.5] * 3,
    "min_pixels": 28 * 28 * 16,
    "max_pixels": 28 * 28 * 96,
}
PROMPTS = {
    "text": {"ids": [BOS, 17, 42, 99, 5, 63, 120, 2001, 9], "images": []},
    "one_image": {
        "ids": [BOS, 17, 42, IMAGE_START, IMAGE_PAD, IMAGE_END, 63, 120, 2001],
        "images": ["chelsea_180x120.png"],
    },
    "two_images": {
        "ids": [BOS, 7, IMAGE_START, IMAGE_PAD, IMAGE_END, 88, IMAGE_START, IMAGE_PAD, IMAGE_END, 3],
        "images": ["astronaut_211x130.jpg", "rocket_90x200.png"],
    },
}


def hf_config() -> transformers.PaddleOCRVLConfig:
    # head_dim 32 is not hidden_size / heads (16), as in the real model (1024 / 16 heads, 128)
    text = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [4, 6, 6]},
    }
    # an 8x8 learned position grid: images of other grids resample it up and down
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "image_size": 112,
        "patch_size": 14,
    }
    return transformers.PaddleOCRVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_PAD,
        video_token_id=VIDEO_PAD,
        vision_start_token_id=IMAGE_START,
        vision_end_token_id=IMAGE_END,
    )


def write_tokenizer(directory: Path) -> None:
    """The tiny SentencePiece tokenizer plus PaddleOCR-VL's image tokens and our chat template."""
    tiny_checkpoints.write_ernie_tokenizer(directory, PADDLEOCR_VL_CHAT_TEMPLATE)
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
    if "PaddleOCRVLForConditionalGeneration" not in registry.model_architectures():
        registry.register(paddleocr_vl_plugin, name="fastdeploy.paddleocr_vl")
    return registry


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, transformers model) of the tiny random checkpoint."""
    directory = tmp_path_factory.mktemp("paddleocr_vl")
    torch.manual_seed(0)
    model = transformers.PaddleOCRVLForConditionalGeneration(hf_config()).float().eval()
    with torch.no_grad():  # larger weights than the init's, so greedy choices are far from ties
        for parameter in model.parameters():
            if parameter.ndim >= 2:
                parameter.normal_(0.0, 0.15)
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR), encoding="utf-8")
    write_tokenizer(directory)
    return str(directory), model


@pytest.fixture(scope="module")
def llm(checkpoint, registered) -> LLM:
    return LLM(model=checkpoint[0], max_model_len=512, limit_mm_per_prompt={"image": 2})


def reference_processor(**preprocessor) -> PaddleOCRVLImageProcessorPil:
    return PaddleOCRVLImageProcessorPil(**(preprocessor or PREPROCESSOR))


def reference_pixels(images: list) -> tuple[np.ndarray | None, np.ndarray | None]:
    if not images:
        return None, None
    out = reference_processor()(images=images, return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"]


def transformers_greedy(model, ids: list[int], images: list) -> list[int]:
    """transformers' greedy tokens; the placeholders expanded from its own processor's grids."""
    return mrope_vl_reference.transformers_greedy(
        model, ids, *reference_pixels(images), IMAGE_PAD, NEW_TOKENS
    )


@pytest.mark.parametrize(
    "size,preprocessor",
    [
        ((180, 120), {}),
        ((37, 500), {}),
        ((1200, 900), {}),
        ((20, 300), {}),  # a side under 28 pixels is scaled up first
        ((300, 13), {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}),
        ((250, 97), PREPROCESSOR),
    ],
)
def test_pixels_equal_the_reference_processor(size, preprocessor):
    rng = np.random.default_rng(sum(size))
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    patches, grid = preprocess_image(image, image_settings({"patch_size": 14}, preprocessor))
    reference = PaddleOCRVLImageProcessorPil(**preprocessor)(images=[image], return_tensors="np")
    assert list(grid) == reference["image_grid_thw"][0].tolist()
    pixels = reference["pixel_values"]
    assert patches.shape == (pixels.shape[0], 3 * 14 * 14)
    np.testing.assert_allclose(patches, pixels.reshape(pixels.shape[0], -1), atol=1e-6, rtol=0)


def test_fixture_photos_equal_the_reference_processor():
    for image in open_images(["astronaut_211x130.jpg", "coffee_250x97.png", "rocket_90x200.png"]):
        patches, grid = preprocess_image(image, image_settings({}, PREPROCESSOR))
        pixels, grids = reference_pixels([image])
        assert list(grid) == grids[0].tolist()
        np.testing.assert_allclose(patches, pixels.reshape(pixels.shape[0], -1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("out_size,in_size", [(13, 8), (5, 8), (8, 8), (1, 4)])
def test_position_resampling_equals_torch_bilinear(out_size, in_size):
    """Each row of the matrix resamples a 1-D signal as F.interpolate(bilinear, align_corners=False)."""
    signal = torch.arange(in_size, dtype=torch.float64) ** 2
    expected = torch.nn.functional.interpolate(
        signal.view(1, 1, 1, in_size), size=(1, out_size), mode="bilinear", align_corners=False
    ).view(-1)
    np.testing.assert_allclose(
        bilinear_matrix(out_size, in_size) @ signal.numpy(), expected.numpy(), atol=1e-12
    )


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_greedy_tokens_equal_transformers(name, llm, expected):
    output = llm.generate([generate_prompt(name)], GREEDY, use_tqdm=False)[0]
    assert output.error_code == 200, output.error_msg
    assert output.outputs.token_ids == expected[name]


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()


def chat(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "OCR:"}]}]


def chat_reference(llm: LLM, model, names: list[str]) -> tuple[str, list[int]]:
    """The rendered chat prompt and transformers' greedy tokens for it."""
    prompt = llm.get_tokenizer().apply_chat_template(
        chat(*map(data_url, names)), tokenize=False, add_generation_prompt=True
    )
    assert prompt.count("<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>") == len(names)
    ids = llm.get_tokenizer().encode(prompt, add_special_tokens=False)
    return prompt, transformers_greedy(model, ids, open_images(names))


def test_chat_with_image_url_parts_equals_transformers(llm, checkpoint):
    """One image as a data: URL, the other as a file:// URL."""
    names = ["chelsea_180x120.png", "rocket_90x200.png"]
    prompt, expected = chat_reference(llm, checkpoint[1], names)
    urls = [data_url(names[0]), (IMAGES / names[1]).as_uri()]
    output = llm.chat(chat(*urls), GREEDY, use_tqdm=False)[0]
    assert output.error_code == 200, output.error_msg
    assert output.prompt == prompt
    assert output.outputs.token_ids == expected


def test_videos_are_refused_naming_the_part(llm):
    frames = [np.zeros((56, 56, 3), dtype=np.uint8)] * 4
    prompt = {
        "prompt_token_ids": [BOS, IMAGE_START, VIDEO_PAD, IMAGE_END, 5],
        "multimodal_data": {"video": [frames]},
    }
    output = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert output.error_code == 400
    assert "videos are not supported for PaddleOCR-VL" in output.error_msg


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
            messages=chat(data_url(names[0])),
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


def test_transformers5_names_and_a_flat_config_load_the_same_model(
    checkpoint, registered, expected, tmp_path
):
    """transformers 5's in-memory names (`model.language_model.*`, `model.visual.*`,
    `model.projector.*`) and the hub's flat config.json (text fields at the top, `rope_scaling`
    carrying mrope_section)."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(Path(checkpoint[0]) / "model.safetensors"))
    renamed = {}
    for name, array in tensors.items():
        if name.startswith("visual."):
            name = "model." + name
        elif name.startswith("mlp_AR."):
            name = "model.projector." + name[len("mlp_AR.") :]
        elif name.startswith("model."):
            name = "model.language_model." + name[len("model.") :]
        renamed[name] = array
    # tensors transformers ignores too
    renamed["visual.vision_model.head.probe"] = np.zeros((1, 32), dtype=np.float32)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    nested = json.loads((Path(checkpoint[0]) / "config.json").read_text(encoding="utf-8"))
    text = nested.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**nested, **text, "rope_theta": rope["rope_theta"]}
    flat["rope_scaling"] = {"type": "default", "mrope_section": rope["mrope_section"]}
    (tmp_path / "config.json").write_text(json.dumps(flat), encoding="utf-8")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR), encoding="utf-8")
    write_tokenizer(tmp_path)
    llm = LLM(model=str(tmp_path), max_model_len=256)
    outputs = llm.generate([generate_prompt("one_image"), generate_prompt("text")], GREEDY, use_tqdm=False)
    assert [output.outputs.token_ids for output in outputs] == [expected["one_image"], expected["text"]]


@pytest.mark.parametrize(
    "field,drop",
    [
        ("mrope_section", lambda config: config["text_config"]["rope_parameters"].pop("mrope_section")),
        ("num_hidden_layers", lambda config: config["text_config"].pop("num_hidden_layers")),
    ],
)
def test_a_config_missing_a_needed_field_names_it(checkpoint, registered, tmp_path, field, drop):
    directory = Path(checkpoint[0])
    for path in directory.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    drop(config)
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match=field):
        LLM(model=str(tmp_path), max_model_len=256)


def test_a_section_that_does_not_fit_the_head_is_named(checkpoint, registered, tmp_path):
    directory = Path(checkpoint[0])
    for path in directory.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config["text_config"]["rope_parameters"]["mrope_section"] = [16, 24, 24]
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(
        InvalidArgumentError, match=r"mrope_section \[16, 24, 24\] must add up to head_dim / 2 = 16"
    ):
        LLM(model=str(tmp_path), max_model_len=256)


@pytest.mark.parametrize("device", ["torch-cpu", "paddle-cpu"])
def test_the_cuda_backends_code_generates_the_same_tokens(device, checkpoint, registered, expected):
    """The cuda backend's own code (its CPU twins) runs the vision encoder and M-RoPE language model."""
    pytest.importorskip(device.split("-")[0], reason=f"the {device} backend needs {device.split('-')[0]}")
    llm = LLM(model=checkpoint[0], device=device, max_model_len=256)
    outputs = llm.generate([generate_prompt("two_images"), generate_prompt("text")], GREEDY, use_tqdm=False)
    assert [output.outputs.token_ids for output in outputs] == [expected["two_images"], expected["text"]]


def test_a_text_prompt_with_fastdeploys_placeholder_equals_transformers(llm, checkpoint):
    """`generate` with a text prompt: `<|image@placeholder|>` becomes the image placeholder token."""
    text = "<|begin_of_sentence|>User: <|IMAGE_START|><|image@placeholder|><|IMAGE_END|>OCR:\nAssistant: "
    ids = llm.get_tokenizer().encode(
        text.replace("<|image@placeholder|>", "<|IMAGE_PLACEHOLDER|>"), add_special_tokens=False
    )
    assert ids.count(IMAGE_PAD) == 1
    images = open_images(["coffee_250x97.png"])
    output = llm.generate({"prompt": text, "multimodal_data": {"image": images}}, GREEDY, use_tqdm=False)[0]
    assert output.error_code == 200, output.error_msg
    assert output.outputs.token_ids == transformers_greedy(checkpoint[1], ids, images)


def test_image_url_parts_through_a_template_that_takes_only_image_parts(llm, checkpoint):
    """The hub's template tests for `{"type": "image"}` parts only (transformers' style); OpenAI
    `image_url` parts still get their placeholders and the same tokens."""
    image_only = PADDLEOCR_VL_CHAT_TEMPLATE.replace('("image", "image_url")', '("image",)')
    assert "image_url" not in image_only
    names = ["chelsea_180x120.png"]
    prompt, expected = chat_reference(llm, checkpoint[1], names)
    output = llm.chat(chat(data_url(names[0])), GREEDY, use_tqdm=False, chat_template=image_only)[0]
    assert output.error_code == 200, output.error_msg
    assert output.prompt == prompt
    assert output.outputs.token_ids == expected


def test_chunked_prefill_splits_images_and_keeps_the_tokens(checkpoint, registered, expected):
    """A 16-token budget splits both images of the two-image prompt across several passes."""
    llm = LLM(model=checkpoint[0], max_model_len=256, max_num_batched_tokens=16)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, n=2)
    output = llm.generate(generate_prompt("two_images"), params, use_tqdm=False)[0]
    assert len(output.prompt_token_ids) > 3 * 16
    assert [sample.token_ids for sample in output.outputs] == [expected["two_images"]] * 2
