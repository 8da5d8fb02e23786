"""The ERNIE-4.5-VL examples of FastDeploy's offline-inference documentation, run as written.

The checkpoint is the tiny random-weight VL model, written to the relative path the examples
name (`baidu/ERNIE-4.5-VL-28B-A3B-Paddle`, in the -Paddle layout). The image URL cannot be
reached here: the chat example's URL is replaced by the same picture as a `data:` URL (the only
edit), and the generate example's `requests.get` is answered from the test fixture.

The chat example passes no sampling parameters, so its reply runs until an end token or the
context (32768). The real model ends its answer; the random-weight one never does, so the fixture
checkpoint caps replies in its generation_config.json (`max_new_tokens`), which the engine applies
to calls without sampling parameters, as vLLM does.
"""

from __future__ import annotations

import base64
import json
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("PIL")
import tiny_vl_checkpoint as tiny  # noqa: E402

from fastdeploy.input.ernie_templates import ERNIE_4_5_VL_CHAT_TEMPLATE  # noqa: E402

IMAGE = Path(__file__).resolve().parents[1] / "fixtures" / "images" / "chelsea_180x120.png"
#: the reply length the fixture's generation_config.json allows (see the module docstring)
CHAT_REPLY_CAP = 24
URL = "https://paddlenlp.bj.bcebos.com/datasets/paddlemix/demo_images/example2.jpg"

CHAT_EXAMPLE = """
from fastdeploy.entrypoints.llm import LLM
# 加载模型
llm = LLM(model="baidu/ERNIE-4.5-VL-28B-A3B-Paddle", tensor_parallel_size=1, max_model_len=32768, limit_mm_per_prompt={"image": 100}, reasoning_parser="ernie-45-vl")

outputs = llm.chat(
    messages=[
        {"role": "user", "content": [ {"type": "image_url", "image_url": {"url": "https://paddlenlp.bj.bcebos.com/datasets/paddlemix/demo_images/example2.jpg"}},
                                     {"type": "text", "text": "图中的文物属于哪个年代"}]}
    ],
    chat_template_kwargs={"enable_thinking": False})

# 输出结果
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs.text
    reasoning_text = output.outputs.reasoning_content
"""

GENERATE_EXAMPLE = """
import io
import requests
from PIL import Image

from fastdeploy.entrypoints.llm import LLM
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.input.ernie4_5_tokenizer import Ernie4_5Tokenizer

PATH = "baidu/ERNIE-4.5-VL-28B-A3B-Paddle"
tokenizer = Ernie4_5Tokenizer.from_pretrained(PATH)

messages = [
    {
        "role": "user",
        "content": [
            {"type":"image_url", "image_url": {"url":"https://paddlenlp.bj.bcebos.com/datasets/paddlemix/demo_images/example2.jpg"}},
            {"type":"text", "text":"图中的文物属于哪个年代"}
        ]
     }
]

prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
images, videos = [], []
for message in messages:
    content = message["content"]
    if not isinstance(content, list):
        continue
    for part in content:
        if part["type"] == "image_url":
            url = part["image_url"]["url"]
            image_bytes = requests.get(url).content
            img = Image.open(io.BytesIO(image_bytes))
            images.append(img)
        elif part["type"] == "video_url":
            url = part["video_url"]["url"]
            video_bytes = requests.get(url).content
            videos.append({
                "video": video_bytes,
                "max_frames": 30
            })

sampling_params = SamplingParams(temperature=0.1, max_tokens=64)
llm = LLM(model=PATH, tensor_parallel_size=1, max_model_len=32768, limit_mm_per_prompt={"image": 100}, reasoning_parser="ernie-45-vl")
outputs = llm.generate(prompts={
    "prompt": prompt,
    "multimodal_data": {
        "image": images,
        "video": videos
    }
}, sampling_params=sampling_params)

# 输出结果
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs.text
    reasoning_text = output.outputs.reasoning_content
"""


@pytest.fixture
def in_model_root(tmp_path, monkeypatch):
    directory = tmp_path / "baidu" / "ERNIE-4.5-VL-28B-A3B-Paddle"
    tiny.write_checkpoint(directory, "paddle", tiny.CHAT_CONFIG)
    tiny.write_vl_tokenizer(directory, ERNIE_4_5_VL_CHAT_TEMPLATE)
    generation_config = {"max_new_tokens": CHAT_REPLY_CAP}
    (directory / "generation_config.json").write_text(json.dumps(generation_config), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return directory


def run(code: str) -> dict:
    namespace: dict = {}
    exec(compile(code, "<seed example>", "exec"), namespace)
    return namespace


def test_chat_example(in_model_root):
    data_url = "data:image/png;base64," + base64.b64encode(IMAGE.read_bytes()).decode()
    namespace = run(CHAT_EXAMPLE.replace(URL, data_url))
    (output,) = namespace["outputs"]
    assert output.error_code == 200, output.error_msg
    assert output.num_input_image_tokens == 24
    assert 0 < len(output.outputs.token_ids) <= CHAT_REPLY_CAP
    assert namespace["reasoning_text"] is None and namespace["generated_text"]  # thinking off


def test_generate_example(in_model_root, monkeypatch):
    fake = types.ModuleType("requests")
    fake.get = lambda url: types.SimpleNamespace(content=IMAGE.read_bytes() if url == URL else b"")
    monkeypatch.setitem(sys.modules, "requests", fake)
    namespace = run(GENERATE_EXAMPLE)
    (output,) = namespace["outputs"]
    assert output.error_code == 200, output.error_msg
    assert output.num_input_image_tokens == 24 and len(output.outputs.token_ids) == 64
    # thinking is on by default: the text so far is reasoning (the tiny model never closes it)
    assert namespace["reasoning_text"] and namespace["generated_text"] == ""
