"""ERNIE-4.5-VL behind the OpenAI server: image_url / video_url content parts in
/v1/chat/completions, streamed and not, through the real `openai` client, with the server's
multimodal flags; bad media answered 400 naming the part while the server keeps serving."""

from __future__ import annotations

import base64
import sys
import threading
from pathlib import Path

import openai
import pytest
import uvicorn
from openai_server_helpers import HOST, free_port, http_post, wait_until

pytest.importorskip("PIL")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
import tiny_vl_checkpoint as tiny  # noqa: E402

from fastdeploy import SamplingParams  # noqa: E402
from fastdeploy.entrypoints.openai.api_server import build_context  # noqa: E402
from fastdeploy.entrypoints.openai.app import build_app  # noqa: E402
from fastdeploy.entrypoints.openai.cli_args import build_parser  # noqa: E402
from fastdeploy.input.ernie_templates import ERNIE_4_5_VL_CHAT_TEMPLATE  # noqa: E402

IMAGES = Path(__file__).resolve().parents[2] / "fixtures" / "images"


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()


def image_message(url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "Describe it."},
            ],
        }
    ]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ernie-vl-server")
    tiny.write_checkpoint(directory, "pt", tiny.CHAT_CONFIG)
    tiny.write_vl_tokenizer(directory, ERNIE_4_5_VL_CHAT_TEMPLATE)
    args = build_parser("test").parse_args(
        [
            "--model", str(directory), "--max-model-len", "512", "--reasoning-parser", "ernie-45-vl",
            "--limit-mm-per-prompt", '{"image": 2}', "--mm-processor-kwargs", '{"image_max_pixels": 50176}',
            "--allowed-local-media-path", str(IMAGES), "--disable-media-url-fetch",
        ]
    )  # fmt: skip
    ctx = build_context(args)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(ctx), host=HOST, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 120, "the in-process server")
    yield ctx, f"http://{HOST}:{port}"
    server.should_exit = True
    thread.join(60)


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1] + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_image_url_parts_answer_as_offline(client, served):
    messages = image_message(data_url("chelsea_180x120.png"))
    reply = client.chat.completions.create(
        model=served[0].served_model_names[0], messages=messages, max_tokens=6, temperature=0
    )
    engine = served[0].engine.engine
    assert (
        reply.usage.prompt_tokens == 13 + 24 or reply.usage.prompt_tokens > 24
    )  # 24 image tokens in the prompt
    stream = client.chat.completions.create(
        model=served[0].served_model_names[0], messages=messages, max_tokens=6, temperature=0, stream=True
    )
    reasoning = "".join(
        getattr(chunk.choices[0].delta, "reasoning_content", None) or "" for chunk in stream if chunk.choices
    )
    assert reasoning == reply.choices[0].message.reasoning_content
    assert engine.input_processor.mm_processor is not None


def test_local_paths_only_under_the_allowed_directory(client, served):
    ok = client.chat.completions.create(
        model=served[0].served_model_names[0],
        messages=image_message(str(IMAGES / "rocket_90x200.png")),
        max_tokens=2,
    )
    assert ok.choices[0].finish_reason == "length"
    status, body = http_post(
        served[1] + "/v1/chat/completions", {"messages": image_message("/etc/hostname"), "max_tokens": 2}
    )
    assert status == 400 and "outside the allowed" in body["error"]["message"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png;base64,@@not-base64@@", "base64"),
        ("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n garbage").decode(), "image"),
        ("data:text/plain;base64," + base64.b64encode(b"plain text").decode(), "not an image"),
        ("https://example.invalid/cat.png", "turned off"),
    ],
)
def test_bad_media_is_a_400_naming_the_part(served, url, message):
    status, body = http_post(
        served[1] + "/v1/chat/completions", {"messages": image_message(url), "max_tokens": 2}
    )
    assert status == 400, body
    assert "message 0 content part 0" in body["error"]["message"] and message in body["error"]["message"]


def test_too_many_images_and_decompression_bombs_are_400(served):
    three = [{"type": "image_url", "image_url": {"url": data_url("camera_64x64_gray.png")}}] * 3
    status, body = http_post(
        served[1] + "/v1/chat/completions", {"messages": [{"role": "user", "content": three}]}
    )
    assert status == 400 and "limit_mm_per_prompt" in body["error"]["message"]
    from io import BytesIO

    from PIL import Image

    buffer = BytesIO()
    Image.new("1", (12000, 12000)).save(buffer, format="PNG")  # 144 M pixels, a few KB
    bomb = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    status, body = http_post(served[1] + "/v1/chat/completions", {"messages": image_message(bomb)})
    assert status == 400 and "decompression bomb" in body["error"]["message"]
    # the server still answers
    status, body = http_post(
        served[1] + "/v1/chat/completions",
        {"messages": image_message(data_url("rocket_90x200.png")), "max_tokens": 2},
    )
    assert status == 200, body


def test_server_reply_equals_offline_chat(served):
    from fastdeploy import LLM

    ctx, url = served
    messages = image_message(data_url("coffee_250x97.png"))
    status, body = http_post(
        url + "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0}
    )
    assert status == 200, body
    llm = LLM(model=ctx.engine.engine.config.model, max_model_len=512, reasoning_parser="ernie-45-vl",
              mm_processor_kwargs={"image_max_pixels": 50176})  # fmt: skip
    (offline,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    assert body["choices"][0]["message"]["reasoning_content"] == offline.outputs.reasoning_content
    assert body["usage"]["prompt_tokens"] == len(offline.prompt_token_ids)


def test_completions_take_a_prompt_dicts_multimodal_data(served):
    """`{"prompt": ..., "multimodal_data": {"image": [...]}}` (vLLM's `multi_modal_data` too), as
    `LLM.generate` takes it: the placeholder expands into the image's 24 tokens."""
    ctx, url = served
    prompt = "<|image@placeholder|>Describe it."
    text_tokens = len(ctx.inputs.mm_processor.encode_text(prompt))
    for key in ("multimodal_data", "multi_modal_data"):
        request = {
            "prompt": {"prompt": prompt, key: {"image": [data_url("chelsea_180x120.png")]}},
            "max_tokens": 2,
        }
        status, body = http_post(url + "/v1/completions", request)
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == text_tokens - 1 + 24
    three = {"image": [data_url("chelsea_180x120.png")] * 3}
    status, body = http_post(
        url + "/v1/completions", {"prompt": {"prompt": prompt * 3, "multimodal_data": three}}
    )
    assert status == 400 and body["error"]["param"] == "prompt"
    assert "limit_mm_per_prompt allows ('image': 2)" in body["error"]["message"]
