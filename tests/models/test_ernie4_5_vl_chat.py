"""ERNIE-4.5-VL through the seeds' calls: `LLM.chat` with image_url parts, `enable_thinking`, the
`ernie-45-vl` parser, and the generate-with-`multimodal_data` recipe of FastDeploy's docs."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "input"))
import tiny_vl_checkpoint as tiny  # noqa: E402
from media_servers import MediaServer  # noqa: E402
from PIL import Image  # noqa: E402

from fastdeploy import LLM, SamplingParams  # noqa: E402
from fastdeploy.input.ernie4_5_tokenizer import Ernie4_5Tokenizer  # noqa: E402
from fastdeploy.input.ernie_templates import ERNIE_4_5_VL_CHAT_TEMPLATE  # noqa: E402

IMAGES = Path(__file__).resolve().parents[1] / "fixtures" / "images"
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("ernie-vl-chat")
    tiny.write_checkpoint(directory, "paddle", tiny.CHAT_CONFIG)
    tiny.write_vl_tokenizer(directory, ERNIE_4_5_VL_CHAT_TEMPLATE)
    return str(directory)


@pytest.fixture(scope="module")
def llm(model_dir) -> LLM:
    return LLM(
        model=model_dir,
        max_model_len=512,
        limit_mm_per_prompt={"image": 2},
        reasoning_parser="ernie-45-vl",
        mm_processor_kwargs={"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 20},
    )


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()


def conversation(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in the picture?"}]}]


def test_chat_with_an_image_url_part(llm):
    output = llm.chat(conversation(data_url("chelsea_180x120.png")), PARAMS, use_tqdm=False)[0]
    assert output.error_code == 200, output.error_msg
    assert output.prompt.startswith(
        "<|begin_of_sentence|>User: Picture 1:<|IMAGE_START|><|image@placeholder|>"
    )
    assert output.prompt.endswith("Assistant: <think>\n")  # thinking on by default
    assert output.num_input_image_tokens == 24  # grid 8x12 -> 96 patches -> 24 tokens
    assert output.prompt_token_ids.count(32012) == 24
    # thinking on: everything before </think> is reasoning (the tiny model never closes it)
    assert output.outputs.reasoning_content and output.outputs.text == ""


def test_enable_thinking_false_through_chat_template_kwargs(llm):
    output = llm.chat(
        conversation(data_url("chelsea_180x120.png")),
        PARAMS,
        use_tqdm=False,
        chat_template_kwargs={"enable_thinking": False},
    )[0]
    assert output.prompt.endswith("Assistant: <think>\n\n</think>\n\n")
    assert output.outputs.reasoning_content is None and output.outputs.text


def test_the_documented_generate_recipe_equals_chat(llm, model_dir):
    """FastDeploy's docs: render with Ernie4_5Tokenizer, then generate with multimodal_data."""
    messages = conversation(data_url("chelsea_180x120.png"))
    tokenizer = Ernie4_5Tokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    image = Image.open(IMAGES / "chelsea_180x120.png")
    generated = llm.generate(
        {"prompt": prompt, "multimodal_data": {"image": [image], "video": []}}, PARAMS, use_tqdm=False
    )
    chatted = llm.chat(messages, PARAMS, use_tqdm=False)
    assert generated[0].prompt_token_ids == chatted[0].prompt_token_ids
    assert generated[0].outputs.token_ids == chatted[0].outputs.token_ids


def test_one_bad_part_fails_alone_in_a_chat_batch(llm):
    good = conversation(data_url("rocket_90x200.png"))
    bad_base64 = conversation("data:image/png;base64,@@@@")
    not_image = conversation("data:text/plain;base64," + base64.b64encode(b"hello").decode())
    too_many = conversation(*[data_url("camera_64x64_gray.png")] * 3)
    outputs = llm.chat([bad_base64, good, not_image, too_many], PARAMS, use_tqdm=False)
    assert outputs[1].error_code == 200, outputs[1].error_msg
    for output, message in zip(
        (outputs[0], outputs[2], outputs[3]), ("base64", "not an image", "limit_mm_per_prompt"), strict=True
    ):
        assert output.error_code == 400 and message in output.error_msg, output.error_msg


def test_video_url_parts_and_frame_lists(llm, tmp_path):
    av = pytest.importorskip("av")
    photo = np.asarray(Image.open(IMAGES / "astronaut_211x130.jpg").convert("RGB"))
    path = tmp_path / "clip.mp4"
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 112, 84, "yuv420p"
        for i in range(8):
            frame = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(photo[:84, i * 10 : i * 10 + 112]), format="rgb24"
            )
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": str(path)}}]}]
    output = llm.chat(messages, PARAMS, use_tqdm=False)[0]
    assert output.error_code == 200, output.error_msg
    assert "Video 1:<|VIDEO_START|>" in output.prompt and output.num_input_video_tokens > 0


def test_media_urls_offline_follow_the_llm_keywords(llm, model_dir):
    """Offline, LLM(...) takes the server's media URL options: by default a loopback URL fails
    alone with the uniform message and is never connected to; with allowed_media_domains,
    media_allow_private_networks and media_url_no_redirects, localhost is fetched (the same
    answer as the PNG inline), 127.0.0.1 is not on the list, and a redirect is refused."""
    media = MediaServer()
    try:
        loopback = conversation(f"http://127.0.0.1:{media.port}/image.png")
        inline, refused = llm.chat(
            [conversation(data_url("chelsea_180x120.png")), loopback], PARAMS, use_tqdm=False
        )
        assert inline.error_code == 200, inline.error_msg
        assert refused.error_code == 400
        assert refused.error_msg == "message 0 content part 0: could not fetch the media URL"
        assert media.connections == 0
        custom = LLM(
            model=model_dir,
            max_model_len=512,
            limit_mm_per_prompt={"image": 2},
            reasoning_parser="ernie-45-vl",
            allowed_media_domains=["localhost"],
            media_allow_private_networks=True,
            media_url_no_redirects=True,
        )
        urls = [f"http://localhost:{media.port}/image.png", f"http://localhost:{media.port}/hop1"]
        fetched, redirected, unlisted = custom.chat(
            [conversation(urls[0]), conversation(urls[1]), loopback], PARAMS, use_tqdm=False
        )
        assert fetched.error_code == 200, fetched.error_msg
        assert fetched.prompt_token_ids == inline.prompt_token_ids
        assert fetched.outputs.token_ids == inline.outputs.token_ids
        for output in (redirected, unlisted):
            assert output.error_msg == "message 0 content part 0: could not fetch the media URL"
        assert media.paths == ["/image.png", "/hop1"]  # the redirect's target and 127.0.0.1: never
        custom.shutdown()
    finally:
        media.close()
