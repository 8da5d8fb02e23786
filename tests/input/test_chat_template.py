"""Chat template rendering, with SmolLM2's ChatML template and small purpose-written templates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.input.chat_template import load_chat_template, render_chat_template, validate_messages
from fastdeploy.input.hf_tokenizer import HFTokenizer

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_smollm2_user_message(smollm2_tokenizer: HFTokenizer) -> None:
    prompt = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert prompt == (
        f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_system_message(smollm2_tokenizer: HFTokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )
    assert smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=False) == expected
    assert smollm2_tokenizer.apply_chat_template(messages) == expected + "<|im_start|>assistant\n"


def test_smollm2_text_parts_are_joined(smollm2_tokenizer: HFTokenizer) -> None:
    """SmolLM2's template concatenates content as a string, so text parts are flattened for it."""
    parts = [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]
    as_parts = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": parts}])
    as_text = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "line one\nline two"}])
    assert as_parts == as_text


def test_template_that_loops_over_parts_gets_them() -> None:
    template = (
        "{% for m in messages %}{% for part in m['content'] %}<{{ part['type'] }}:{{ part.get('text', '') }}>"
        "{% endfor %}{% endfor %}"
    )
    content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert render_chat_template(template, [{"role": "user", "content": content}]) == "<text:hi><image_url:>"


#: a transformers-style template: it tests for in-memory `image` / `video` parts only
IMAGE_PART_TEMPLATE = (
    "{% for m in messages %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<img>{% elif p['type'] == 'video' %}<vid>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endfor %}"
)


def test_url_parts_reach_a_template_that_tests_only_for_image_parts() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "video_url", "video_url": {"url": "file:///clip.mp4"}},
                {"type": "text", "text": "What?"},
            ],
        }
    ]
    assert render_chat_template(IMAGE_PART_TEMPLATE, messages) == "<img><vid>What?"
    assert messages[0]["content"][0]["type"] == "image_url"  # the caller's messages are untouched


def test_url_parts_stay_for_a_template_that_names_them() -> None:
    template = (
        "{% for m in messages %}{% for p in m['content'] %}"
        "{% if p['type'] == 'image_url' %}[url]{% elif p['type'] == 'image' %}[image]{% endif %}"
        "{% endfor %}{% endfor %}"
    )
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}, {"type": "image"}]}]
    assert render_chat_template(template, messages) == "[url][image]"


def test_non_text_part_for_string_template() -> None:
    content = [{"type": "image_url", "image_url": {"url": "x"}}]
    with pytest.raises(InvalidArgumentError, match=r"messages\[0\] has a 'image_url' content part"):
        render_chat_template("{{ messages[0]['content'] }}", [{"role": "user", "content": content}])


def test_chat_template_kwargs_reach_the_template(smollm2_tokenizer: HFTokenizer) -> None:
    template = "{% if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}{{ messages[0]['content'] }}"
    messages = [{"role": "user", "content": "q"}]
    assert render_chat_template(template, messages, enable_thinking=False) == "<no_think>q"
    assert render_chat_template(template, messages, enable_thinking=True) == "q"
    assert render_chat_template(template, messages) == "q"
    assert (
        smollm2_tokenizer.apply_chat_template(messages, chat_template=template, enable_thinking=False)
        == "<no_think>q"
    )


def test_special_tokens_and_kwargs_precedence() -> None:
    template = "{{ bos_token }}|{{ eos_token }}|{{ tools }}|{{ add_generation_prompt }}"
    messages = [{"role": "user", "content": "x"}]
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    assert render_chat_template(template, messages, special_tokens=special) == "<s>|</s>|None|True"
    assert render_chat_template(template, messages, False, special, eos_token="E") == "<s>|E|None|False"


def test_huggingface_environment() -> None:
    messages = [{"role": "user", "content": "x"}]
    # trim_blocks and lstrip_blocks: block tags leave no newline or indentation behind
    assert (
        render_chat_template("{% if true %}\n    {% if true %}\nA\n    {% endif %}\n{% endif %}\n", messages)
        == "A\n"
    )
    # tojson does not HTML-escape and keeps non-ASCII; indent is accepted
    assert render_chat_template("{{ {'k': '<&>\\'é'} | tojson }}", messages) == json.dumps(
        {"k": "<&>'é"}, ensure_ascii=False
    )
    assert render_chat_template("{{ [1] | tojson(indent=2) }}", messages) == "[\n  1\n]"
    # loop controls
    assert (
        render_chat_template(
            "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}", messages
        )
        == "01"
    )
    # strftime_now
    assert len(render_chat_template("{{ strftime_now('%Y-%m-%d') }}", messages)) == 10


def test_raise_exception_becomes_invalid_argument() -> None:
    template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}"
    with pytest.raises(InvalidArgumentError, match="first message must be system"):
        render_chat_template(template, [{"role": "user", "content": "x"}])


def test_runtime_error_becomes_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="failed to render"):
        render_chat_template("{{ messages[0]['content'] + 1 }}", [{"role": "user", "content": "x"}])


def test_syntax_error_names_the_line() -> None:
    with pytest.raises(InvalidArgumentError, match=r"not valid Jinja \(line 2\).*"):
        render_chat_template("ok\n{% for m in messages %}", [{"role": "user", "content": "x"}])


def test_sandbox() -> None:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidArgumentError):
        render_chat_template("{% set _ = messages.append(1) %}", messages)
    with pytest.raises(InvalidArgumentError, match="namespace attribute '_x'"):
        render_chat_template("{% set ns = namespace(_x=1) %}", messages)
    assert render_chat_template("{% set ns = namespace(n=1) %}{% set ns.n = 2 %}{{ ns.n }}", messages) == "2"


def test_no_template() -> None:
    for template in (None, ""):
        with pytest.raises(InvalidArgumentError, match="no chat template.*chat_template="):
            render_chat_template(template, [{"role": "user", "content": "x"}])


def test_model_without_template(smollm2_tokenizer: HFTokenizer) -> None:
    bare = HFTokenizer(smollm2_tokenizer.backend)
    with pytest.raises(InvalidArgumentError, match="the model has no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("hello", r"messages must be a list"),
        ([], r"messages is empty"),
        ([{"role": "user", "content": "a"}, "b"], r"messages\[1\] must be a dict"),
        ([{"content": "a"}], r"messages\[0\] needs a non-empty string 'role'"),
        ([{"role": "user"}], r"messages\[0\] \(role 'user'\) has no 'content'"),
        ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\] must be a string or a list"),
        (
            [{"role": "user", "content": [{"text": "a"}]}],
            r"messages\[0\]\['content'\]\[0\] must be a dict with a string 'type'",
        ),
        (
            [{"role": "user", "content": [{"type": "text"}]}],
            r"messages\[0\]\['content'\]\[0\] is a text part without",
        ),
    ],
)
def test_bad_messages(messages: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        render_chat_template("{{ messages }}", messages)


def test_assistant_tool_call_may_omit_content() -> None:
    messages = [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]
    assert validate_messages(messages) == messages


def test_template_sees_only_plain_data() -> None:
    """Rich objects in messages reach the template as placeholders, never as callable objects."""

    class Image:
        def save(self, path: str) -> None:
            raise AssertionError("a template called a method of a message object")

    template = "{% for part in messages[0]['content'] %}{{ part['image'] }}{% endfor %}{{ flag }}"
    content = [{"type": "image", "image": Image()}]
    assert render_chat_template(template, [{"role": "user", "content": content}], flag=np.bool_(False)) == (
        "<Image>False"
    )
    calls_save = "{% for part in messages[0]['content'] %}{{ part['image'].save('x') }}{% endfor %}"
    with pytest.raises(InvalidArgumentError, match="has no attribute 'save'"):
        render_chat_template(calls_save, [{"role": "user", "content": content}])


def test_messages_are_not_modified() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    render_chat_template("{{ messages[0]['content'] }}", messages)
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "a"}]}]


def test_load_chat_template(tmp_path: Path) -> None:
    literal = "{{ messages[0]['content'] }}"
    assert load_chat_template(literal) == literal
    jinja = tmp_path / "t.jinja"
    jinja.write_text(literal, encoding="utf-8")
    assert load_chat_template(str(jinja)) == literal
    assert load_chat_template(jinja) == literal
    as_json = tmp_path / "chat_template.json"
    as_json.write_text(json.dumps({"chat_template": literal}), encoding="utf-8")
    assert load_chat_template(as_json) == literal
    with pytest.raises(InvalidArgumentError, match="neither a Jinja template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    (tmp_path / "bad.json").write_text("[]", encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="'chat_template' string"):
        load_chat_template(tmp_path / "bad.json")
    with pytest.raises(InvalidArgumentError, match="must be a str or a path"):
        load_chat_template(42)  # type: ignore[arg-type]
