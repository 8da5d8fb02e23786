"""GPT-OSS's harmony format: the chat template against harmony's published renderings, and the
`gpt-oss` reasoning parser on scripted token outputs (reasoning, answer, function calls, streaming).

The expected prompts are the renderings the harmony format's reference implementation gives for
the same conversations (its test data), written out by hand here.
"""

from __future__ import annotations

import json

import pytest

from fastdeploy.input.chat_template import render_chat_template
from fastdeploy.input.harmony_template import HARMONY_CHAT_TEMPLATE
from fastdeploy.plugins.registry import get_registry
from fastdeploy.reasoning.harmony import HarmonyReasoningParser
from fastdeploy.tool_calling.request import finish_answer, plan_tools

SYSTEM = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n{date}\nReasoning: {effort}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.{calls}<|end|>"
)
CALLS_LINE = "\nCalls to these tools must go to the commentary channel: 'functions'."
WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_location", "description": "Gets the location of the user."},
    },
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Gets the current weather in the provided location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                    "days": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["location"],
            },
        },
    },
]


def _system(effort: str = "medium", date: str | None = None, calls: bool = False) -> str:
    return SYSTEM.format(
        effort=effort, date=f"Current date: {date}\n" if date else "", calls=CALLS_LINE if calls else ""
    )


def test_simple_conversation_renders_the_default_system_message():
    prompt = render_chat_template(HARMONY_CHAT_TEMPLATE, [{"role": "user", "content": "What is 2 + 2?"}])
    assert prompt == _system() + "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant"


def test_system_message_becomes_developer_instructions_with_the_reasoning_effort():
    messages = [
        {"role": "system", "content": "Answer the user's questions like a robot."},
        {"role": "user", "content": "What is the capital of the largest country in the world?"},
    ]
    prompt = render_chat_template(HARMONY_CHAT_TEMPLATE, messages, reasoning_effort="high")
    assert prompt == (
        _system("high")
        + "<|start|>developer<|message|># Instructions\n\nAnswer the user's questions like a robot.<|end|>"
        "<|start|>user<|message|>What is the capital of the largest country in the world?<|end|>"
        "<|start|>assistant"
    )


def test_tools_render_as_a_typescript_namespace():
    messages = [
        {"role": "developer", "content": "Always respond in riddles"},
        {"role": "user", "content": "What is the weather like in SF?"},
    ]
    prompt = render_chat_template(
        HARMONY_CHAT_TEMPLATE,
        messages,
        tools=WEATHER_TOOLS,
        reasoning_effort="low",
        current_date="2025-06-28",
    )
    assert prompt == (
        _system("low", "2025-06-28", calls=True)
        + "<|start|>developer<|message|># Instructions\n\nAlways respond in riddles\n\n# Tools\n\n## functions\n\n"
        "namespace functions {\n\n"
        "// Gets the location of the user.\ntype get_location = () => any;\n\n"
        "// Gets the current weather in the provided location.\ntype get_current_weather = (_: {\n"
        "// The city and state, e.g. San Francisco, CA\nlocation: string,\n"
        'format?: "celsius" | "fahrenheit", // default: celsius\n'
        "days?: number[],\n"
        "}) => any;\n\n} // namespace functions<|end|>"
        "<|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant"
    )


def test_a_turn_under_way_keeps_its_reasoning_and_earlier_turns_drop_theirs():
    messages = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "reasoning_content": "Simple sum.", "content": "2 + 2 equals 4."},
        {"role": "user", "content": "What is the weather in SF?"},
        {
            "role": "assistant",
            "reasoning_content": "We need to use lookup_weather tool.",
            "tool_calls": [
                {
                    "id": "call-1",
                    "type": "function",
                    "function": {"name": "lookup_weather", "arguments": {"location": "San Francisco"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call-1", "content": '{"temperature": 20, "description": "sunny"}'},
    ]
    prompt = render_chat_template(HARMONY_CHAT_TEMPLATE, messages)
    assert prompt == (
        _system() + "<|start|>user<|message|>What is 2 + 2?<|end|>"
        "<|start|>assistant<|channel|>final<|message|>2 + 2 equals 4.<|end|>"
        "<|start|>user<|message|>What is the weather in SF?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>We need to use lookup_weather tool.<|end|>"
        "<|start|>assistant to=functions.lookup_weather<|channel|>commentary <|constrain|>json"
        '<|message|>{"location": "San Francisco"}<|call|>'
        '<|start|>functions.lookup_weather<|message|>{"temperature": 20, "description": "sunny"}<|end|>'
        "<|start|>assistant"
    )


def test_the_template_is_the_gpt_oss_family_fallback():
    assert get_registry().chat_templates()["GptOssForCausalLM"] == HARMONY_CHAT_TEMPLATE


class PieceTokenizer:
    """Token id i decodes to PIECES[i]; the harmony control tokens are special."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        kept = [self.pieces[i] for i in token_ids]
        if skip_special_tokens:
            kept = [piece for piece in kept if not (piece.startswith("<|") and piece.endswith("|>"))]
        return "".join(kept)


PIECES = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
PIECES += ["assistant", "analysis", "final", "commentary", " to=functions.get_weather", "json", " "]
PIECES += ["Think", " more", ".", "Sunny", " in", " Paris", '{"city":', ' "Paris"}', "Hi"]
IDS = {piece: index for index, piece in enumerate(PIECES)}


def _ids(*pieces: str) -> list[int]:
    return [IDS[piece] for piece in pieces]


REASONING = _ids("<|channel|>", "analysis", "<|message|>", "Think", " more", ".", "<|end|>")
ANSWER = _ids("<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Sunny", " in", " Paris")
CALL = _ids(
    "<|start|>", "assistant", " to=functions.get_weather", "<|channel|>", "commentary", " ", "<|constrain|>",
    "json", "<|message|>", '{"city":', ' "Paris"}', "<|call|>",
)  # fmt: skip


@pytest.fixture
def parser() -> HarmonyReasoningParser:
    return HarmonyReasoningParser(PieceTokenizer(PIECES))


def _split(parser, ids, finished):
    text = parser.tokenizer.decode(ids)  # what the engine's text holds: no control tokens
    return parser.split_output(ids, text, thinking_enabled=True, finished=finished)


def test_analysis_is_reasoning_and_final_is_the_answer(parser):
    split = _split(parser, REASONING + ANSWER + _ids("<|return|>"), finished=True)
    assert (split.reasoning_content, split.content, split.tool_calls) == (
        "Think more.",
        "Sunny in Paris",
        None,
    )


def test_a_function_call_message_becomes_a_tool_call(parser):
    split = _split(parser, REASONING + CALL, finished=True)
    assert split.reasoning_content == "Think more."
    assert split.content == ""
    (call,) = split.tool_calls
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_recipient_after_the_channel_is_read_too(parser):
    ids = _ids(
        "<|channel|>", "commentary", " to=functions.get_weather", "<|message|>", '{"city":', ' "Paris"}'
    )
    split = _split(parser, ids + _ids("<|call|>"), finished=True)
    assert split.tool_calls[0]["function"]["name"] == "get_weather"


def test_streamed_splits_only_grow(parser):
    ids = REASONING + ANSWER + _ids("<|return|>")
    shown_reasoning, shown_answer = "", ""
    for end in range(1, len(ids) + 1):
        split = _split(parser, ids[:end], finished=end == len(ids))
        reasoning = split.reasoning_content or ""
        assert reasoning.startswith(shown_reasoning) and split.content.startswith(shown_answer)
        assert split.tool_calls is None
        shown_reasoning, shown_answer = reasoning, split.content
    assert (shown_reasoning, shown_answer) == ("Think more.", "Sunny in Paris")


def test_calls_are_reported_once_the_output_is_finished(parser):
    assert _split(parser, REASONING + CALL, finished=False).tool_calls is None


def test_header_still_being_written_shows_nothing_and_plain_output_is_the_answer(parser):
    assert _split(parser, _ids("<|channel|>", "analysis"), finished=False).content == ""
    split = _split(parser, _ids("Hi", " in", " Paris"), finished=True)
    assert (split.reasoning_content, split.content) == (None, "Hi in Paris")


def test_harmony_calls_reach_the_chat_answer_through_the_tool_parser(parser):
    split = _split(parser, REASONING + CALL, finished=True)
    tool_parser = get_registry().tool_call_parsers()["openai"]
    plan = plan_tools(WEATHER_TOOLS, "auto", lambda: tool_parser(None), "")
    content, calls = finish_answer(plan, split.content, split.tool_calls)
    assert content == "" and [call["function"]["name"] for call in calls] == ["get_weather"]


def test_parsers_are_registered_by_name():
    registry = get_registry()
    assert registry.reasoning_parsers()["gpt-oss"] is HarmonyReasoningParser
    assert registry.reasoning_parsers()["harmony"] is HarmonyReasoningParser
    assert registry.tool_call_parsers()["gpt-oss"] is registry.tool_call_parsers()["openai"]
