"""Tool-call parsers read calls out of answers, whole and token by token, as clients accumulate them."""

from __future__ import annotations

import json

import pytest

from fastdeploy.plugins.registry import get_registry
from fastdeploy.tool_calling.forced import NamedFunctionParser, RequiredCallsParser
from fastdeploy.tool_calling.json_scan import scan_call
from fastdeploy.tool_calling.stream import ToolCallStream
from fastdeploy.tool_calling.tagged import HermesToolParser

HERMES_ANSWER = (
    "Let me check both cities.\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Berlin", "nested": {"a": [1, "}"]}}}\n</tool_call>'
)
HERMES_CALLS = [
    ("get_weather", {"city": "Paris", "unit": "celsius"}),
    ("get_time", {"zone": "Europe/Berlin", "nested": {"a": [1, "}"]}}),
]


def accumulate(parser, text: str, step: int = 1) -> tuple[str, list[dict]]:
    """Feed `text` in `step`-character slices as a stream would, and accumulate the deltas as the
    openai client does: content concatenated, calls merged by index (arguments concatenated)."""
    stream = ToolCallStream(parser)
    content, calls = "", {}
    for end in [*range(step, len(text), step), len(text)]:
        delta = stream.update(text[:end], finished=end == len(text))
        content += delta.content
        for item in delta.tool_calls:
            call = calls.setdefault(item["index"], {"id": None, "name": "", "arguments": ""})
            if "id" in item:
                assert call["id"] is None, "a call's id is sent once"
                call["id"] = item["id"]
                assert item["function"]["arguments"] == "" and item["type"] == "function"
            call["name"] += item["function"].get("name", "")
            call["arguments"] += item["function"].get("arguments", "")
    return content, [calls[index] for index in sorted(calls)]


def test_hermes_whole_answer():
    extraction = HermesToolParser().extract_tool_calls(HERMES_ANSWER)
    assert extraction.tools_called and extraction.content == "Let me check both cities."
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in extraction.tool_calls]
    assert calls == HERMES_CALLS


@pytest.mark.parametrize("step", [1, 3, 17])
def test_hermes_streamed_deltas_accumulate_to_the_calls(step):
    content, calls = accumulate(HermesToolParser(), HERMES_ANSWER, step)
    assert content == "Let me check both cities."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == HERMES_CALLS
    assert all(c["id"].startswith("chatcmpl-tool-") for c in calls)


def test_partial_tag_and_trailing_whitespace_are_held_back_until_known():
    parser = HermesToolParser()
    assert parser.parse("Sure <tool_", finished=False).content == "Sure"
    assert parser.parse("Sure <tool_box", finished=True).content == "Sure <tool_box"
    assert accumulate(parser, "Plain answer.\n")[0] == "Plain answer.\n"


def test_name_after_arguments_and_malformed_blocks():
    text = '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call><tool_call>oops</tool_call>'
    content, calls = accumulate(HermesToolParser(), text)
    assert content == "" and [(c["name"], json.loads(c["arguments"])) for c in calls] == [("f", {"x": 1})]
    assert [c["function"]["name"] for c in HermesToolParser().extract_tool_calls(text).tool_calls] == ["f"]


def test_scan_call_prefixes_only_grow():
    text = '{"name": "f", "arguments": {"s": "a\\"}b", "n": [1, 2]}}'
    previous = ""
    for end in range(1, len(text) + 1):
        draft, _ = scan_call(text[:end], 0)
        assert draft.arguments.startswith(previous)
        previous = draft.arguments
    draft, stop = scan_call(text, 0)
    assert (
        draft.name == "f" and json.loads(draft.arguments) == {"s": 'a"}b', "n": [1, 2]} and stop == len(text)
    )


def test_quoted_arguments_arrive_whole():
    text = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>'
    assert accumulate(HermesToolParser(), text)[1][0]["arguments"] == '{"x": 2}'


def test_forced_call_parsers():
    content, calls = accumulate(NamedFunctionParser("get_weather"), '{"city": "Rome"}', step=2)
    assert (
        content == ""
        and calls[0]["name"] == "get_weather"
        and json.loads(calls[0]["arguments"]) == {"city": "Rome"}
    )
    answer = '[{"name": "a", "parameters": {"k": [1]}}, {"name": "b", "parameters": {}}]'
    _, calls = accumulate(RequiredCallsParser(), answer, step=4)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("a", {"k": [1]}), ("b", {})]


def test_parsers_are_registered():
    parsers = get_registry().tool_call_parsers()
    assert parsers["hermes"] is HermesToolParser and parsers["qwen3"] is HermesToolParser
    assert "ernie-x1" in parsers


def test_the_plugin_guide_example_parser_works():
    """docs/plugins.md's tool-call parser example runs as written."""
    import pathlib
    import re

    guide = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = guide[guide.index("## A tool-call parser") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/plugins.md", "exec"), namespace)
    parser = namespace["PythonTagToolParser"]()
    answer = 'Checking.<|python_tag|>{"name": "f", "arguments": {"x": [1]}}'
    content, calls = accumulate(parser, answer, step=5)
    assert content == "Checking." and [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("f", {"x": [1]})
    ]
    assert namespace["fastdeploy_tool_call_parsers"]() == {"python-tag": parser.__class__}
