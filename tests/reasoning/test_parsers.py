"""The `ernie-45-vl`, `ernie-x1` and `qwen3` reasoning parsers: full outputs and streamed deltas.

Each table row is an output text, whether thinking was on, and the expected reasoning / answer
(written by hand from the formats FastDeploy's parsers read). Streaming feeds the parser every
prefix of the text (one character at a time, so every tag is split across "tokens"), and also
the pieces of the real ERNIE tokenizer, and checks each split extends the previous one and that
the deltas add up to the full split.
"""

from __future__ import annotations

import json

import pytest
import tiny_checkpoints as tiny

from fastdeploy.engine.request import CompletionOutput
from fastdeploy.entrypoints.streaming import DeltaTracker
from fastdeploy.plugins.registry import get_registry
from fastdeploy.reasoning.base import ReasoningSplit
from fastdeploy.reasoning.tool_calls import extract_tool_calls
from fastdeploy.tool_calling.tagged import ErnieX1TaggedToolParser

# (id, text, thinking_enabled, reasoning_content, content)
THINK_CASES = [
    ("prompt-opened", "思考过程\n</think>\n\n答案是 2。", True, "思考过程", "答案是 2。"),
    (
        "model-opened",
        "<think>\nLet me see.\n\nStep 2.\n</think>\n\nThe answer.",
        True,
        "Let me see.\n\nStep 2.",
        "The answer.",
    ),
    ("leading-space-before-think", "  <think>r</think>a", True, "r", "a"),
    ("empty-reasoning", "<think>\n\n</think>\n\nDirect answer", True, "", "Direct answer"),
    ("no-closing-tag", "still thinking about 北京", True, "still thinking about 北京", ""),
    ("no-closing-tag-opened", "<think>\nhalf a thought\n", True, "half a thought", ""),
    ("second-end-tag-is-answer-text", "r</think>a </think> b", True, "r", "a </think> b"),
    ("answer-keeps-inner-newlines", "r\n</think>\n\nline 1\n\nline 2\n", True, "r", "line 1\n\nline 2\n"),
    ("thinking-off", "Just the answer.\n", False, None, "Just the answer.\n"),
    ("thinking-off-with-lt", "<b>bold</b> answer", False, None, "<b>bold</b> answer"),
    ("thinking-off-but-model-thinks", "<think>oops</think>\n\nanswer", False, "oops", "answer"),
    ("empty-output", "", True, "", ""),
]

# (id, text, thinking_enabled, reasoning_content, content, [(name, arguments)] or None)
X1_CASES = [
    ("response", "思考\n</think>\n\n<response>\n答案\n</response>", True, "思考", "答案", None),
    (
        "tool-call",
        '需要查天气\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "北京"}}\n</tool_call>\n',
        True,
        "需要查天气",
        "",
        [("get_weather", {"location": "北京"})],
    ),
    (
        "two-tool-calls",
        'r</think>\n<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
        True,
        "r",
        "",
        [("a", {"x": 1}), ("b", {})],
    ),
    (
        "response-then-tool-call",
        'r</think><response>\nLet me check.\n</response>\n<tool_call>{"name": "f", "arguments": {"q": "x"}}</tool_call>',
        True,
        "r",
        "Let me check.",
        [("f", {"q": "x"})],
    ),
    ("plain-answer", "r\n</think>\n\nplain answer", True, "r", "plain answer", None),
    (
        "plain-answer-then-tool-call",
        'r</think>Checking.\n\n<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        True,
        "r",
        "Checking.",
        [("f", {})],
    ),
    ("unclosed-response", "r</think>\n<response>\npartial answer", True, "r", "partial answer", None),
    ("no-closing-think", "thinking forever\n", True, "thinking forever", "", None),
    (
        "tool-call-inside-reasoning-is-not-a-call",
        'maybe <tool_call>{"name": "x", "arguments": {}}</tool_call> later',
        True,
        'maybe <tool_call>{"name": "x", "arguments": {}}</tool_call> later',
        "",
        None,
    ),
    ("bad-json-tool-call", "r</think><tool_call>{not json}</tool_call>", True, "r", "", None),
    ("thinking-off-response", "<response>\nanswer\n</response>", False, None, "answer", None),
    (
        "thinking-off-tool-call",
        '<tool_call>\n{"name": "f", "arguments": {"k": "v"}}\n</tool_call>',
        False,
        None,
        "",
        [("f", {"k": "v"})],
    ),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from fastdeploy.input.ernie4_5_tokenizer import Ernie4_5Tokenizer

    directory = tmp_path_factory.mktemp("tok")
    tiny.write_ernie_tokenizer(directory)
    return Ernie4_5Tokenizer.from_pretrained(str(directory))


def parser(name: str, tokenizer):
    return get_registry().reasoning_parsers()[name](tokenizer)


def calls_of(split: ReasoningSplit):
    if split.tool_calls is None:
        return None
    for call in split.tool_calls:
        assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in split.tool_calls]


def stream(parser_, chunks: list[str], thinking: bool) -> ReasoningSplit:
    """Feed growing prefixes; check each split extends the last and that the server's delta
    tracker streams exactly the final parts; return the final split."""
    text, tracker = "", DeltaTracker()
    previous = ReasoningSplit("", "")
    reasoning_deltas, content_deltas = [], []
    for index, chunk in enumerate(chunks):
        text += chunk
        split = parser_.split(text, thinking_enabled=thinking, finished=index == len(chunks) - 1)
        assert (split.reasoning_content or "").startswith(previous.reasoning_content or ""), (text, split)
        assert split.content.startswith(previous.content), (text, split)
        sample = CompletionOutput(0, 0, [], split.content, reasoning_content=split.reasoning_content)
        delta = tracker.update(sample)
        reasoning_deltas.append(delta.reasoning_content)
        content_deltas.append(delta.text)
        previous = split
    assert "".join(reasoning_deltas) == (previous.reasoning_content or "")
    assert "".join(content_deltas) == previous.content
    return previous


@pytest.mark.parametrize("name", ["ernie-45-vl", "qwen3"])
@pytest.mark.parametrize(
    ("case", "text", "thinking", "reasoning", "content"), THINK_CASES, ids=[c[0] for c in THINK_CASES]
)
def test_think_parsers_full_output(tokenizer, name, case, text, thinking, reasoning, content):
    split = parser(name, tokenizer).split(text, thinking_enabled=thinking, finished=True)
    assert (split.reasoning_content, split.content, split.tool_calls) == (reasoning, content, None)


@pytest.mark.parametrize("name", ["ernie-45-vl", "qwen3", "ernie-x1"])
@pytest.mark.parametrize(
    ("case", "text", "thinking", "reasoning", "content"), THINK_CASES[:9], ids=[c[0] for c in THINK_CASES[:9]]
)
def test_think_parsers_stream_character_by_character(
    tokenizer, name, case, text, thinking, reasoning, content
):
    final = stream(parser(name, tokenizer), list(text) or [""], thinking)
    assert (final.reasoning_content, final.content) == (reasoning, content)


@pytest.mark.parametrize(
    ("case", "text", "thinking", "reasoning", "content", "calls"), X1_CASES, ids=[c[0] for c in X1_CASES]
)
def test_ernie_x1_full_output(tokenizer, case, text, thinking, reasoning, content, calls):
    split = parser("ernie-x1", tokenizer).split(text, thinking_enabled=thinking, finished=True)
    assert (split.reasoning_content, split.content, calls_of(split)) == (reasoning, content, calls)


@pytest.mark.parametrize(
    ("case", "text", "thinking", "reasoning", "content", "calls"), X1_CASES, ids=[c[0] for c in X1_CASES]
)
def test_ernie_x1_streams_character_by_character(tokenizer, case, text, thinking, reasoning, content, calls):
    final = stream(parser("ernie-x1", tokenizer), list(text), thinking)
    assert (final.reasoning_content, final.content, calls_of(final)) == (reasoning, content, calls)


@pytest.mark.parametrize(
    ("case", "text", "thinking", "reasoning", "content", "calls"), X1_CASES, ids=[c[0] for c in X1_CASES]
)
def test_ernie_x1_streams_tokenizer_pieces(tokenizer, case, text, thinking, reasoning, content, calls):
    """Deltas as the engine produces them: the decoded text of each generated token."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [tokenizer.decode(ids[: i + 1]) for i in range(len(ids))]
    chunks = [pieces[0]] + [b[len(a) :] for a, b in zip(pieces, pieces[1:], strict=False)]
    assert "".join(chunks) == text
    final = stream(parser("ernie-x1", tokenizer), chunks, thinking)
    assert (final.reasoning_content, final.content, calls_of(final)) == (reasoning, content, calls)


def test_partial_tags_are_held_back_while_streaming(tokenizer):
    vl = parser("ernie-45-vl", tokenizer)
    assert vl.split("abc\n</thi", thinking_enabled=True, finished=False) == ReasoningSplit("abc", "")
    assert vl.split("<thi", thinking_enabled=True, finished=False) == ReasoningSplit("", "")
    # once finished, a fragment that never became a tag is text
    assert vl.split("abc</thi", thinking_enabled=True, finished=True) == ReasoningSplit("abc</thi", "")
    x1 = parser("ernie-x1", tokenizer)
    assert x1.split("r</think>\n<resp", thinking_enabled=True, finished=False).content == ""
    assert x1.split("r</think><response>ok</resp", thinking_enabled=True, finished=False).content == "ok"
    assert x1.split("r</think>done\n<tool_", thinking_enabled=True, finished=False).content == "done"


def test_tool_calls_only_once_finished(tokenizer):
    text = 'r</think><tool_call>{"name": "f", "arguments": {}}</tool_call>'
    x1 = parser("ernie-x1", tokenizer)
    assert x1.split(text, thinking_enabled=True, finished=False).tool_calls is None
    assert calls_of(x1.split(text, thinking_enabled=True, finished=True)) == [("f", {})]


@pytest.mark.parametrize("name", ["ernie-45-vl", "ernie-x1", "qwen3"])
def test_end_of_thinking_tokens_are_the_tokenizers_single_tag(tokenizer, name):
    assert parser(name, tokenizer).reasoning_end_token_ids() == [tiny.added_token_id("</think>")]


def test_ernie_x1_tool_parser_is_registered_and_extracts_arguments_as_json():
    registered = get_registry().tool_call_parsers()["ernie-x1"]
    assert registered is ErnieX1TaggedToolParser
    result = registered(None).extract_tool_calls(
        'Sure.\n<tool_call>\n{"name": "search", "arguments": {"query": ["天气", 1]}}\n</tool_call>'
    )
    assert result.tools_called and result.content == "Sure."
    assert json.loads(result.tool_calls[0]["function"]["arguments"]) == {"query": ["天气", 1]}
    assert "天气" in result.tool_calls[0]["function"]["arguments"]  # not \\u-escaped
    assert registered(None).extract_tool_calls("no calls").tools_called is False
    assert extract_tool_calls('<tool_call>{"name": ""}</tool_call><tool_call>[1]</tool_call>') == []
