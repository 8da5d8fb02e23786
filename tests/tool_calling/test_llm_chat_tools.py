"""`LLM.chat(messages, tools=..., tool_choice=...)`: forced calls valid for their schemas, auto calls
read by the configured parser, tools and tool results rendered by the template, errors per call."""

from __future__ import annotations

import json

import jsonschema
import pytest
from tool_fixtures import FORCED_CALL_REGEX, QUESTION, SCHEMAS, TOOLS, TOOLS_TEMPLATE

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=60)


def calls_of(output) -> list[tuple[str, dict]]:
    assert output.error_code == 200, output.error_msg
    calls = output.outputs.tool_calls or []
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    return [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls]


def test_named_function_arguments_follow_its_schema(llm):
    choice = {"type": "function", "function": {"name": "get_time"}}
    (output,) = llm.chat(QUESTION, GREEDY, use_tqdm=False, tools=TOOLS, tool_choice=choice)
    ((name, arguments),) = calls_of(output)
    assert name == "get_time" and output.outputs.text == ""
    jsonschema.validate(arguments, SCHEMAS["get_time"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_calls_are_known_functions_with_valid_arguments(llm, temperature):
    params = SamplingParams(temperature=temperature, seed=2, n=2, max_tokens=80)
    (output,) = llm.chat(QUESTION, params, use_tqdm=False, tools=TOOLS, tool_choice="required")
    for sample in output.outputs:
        assert sample.tool_calls, sample.text
        for call in sample.tool_calls:
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


def test_tools_and_tool_results_reach_the_template(llm):
    first = [{"role": "system", "content": "Be brief."}, *QUESTION]
    (turn1,) = llm.chat(
        first, GREEDY, use_tqdm=False, tools=TOOLS, tool_choice="required", chat_template=TOOLS_TEMPLATE
    )
    assert (
        '"name": "get_weather"' in turn1.prompt
        and '"description": "Local time in a time zone"' in turn1.prompt
    )
    call = turn1.outputs.tool_calls[0]
    second = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "22 degrees and sunny"},
    ]
    (turn2,) = llm.chat(
        second, GREEDY, use_tqdm=False, tools=TOOLS, tool_choice="none", chat_template=TOOLS_TEMPLATE
    )
    assert turn2.error_code == 200 and turn2.outputs.tool_calls is None and turn2.outputs.text
    assert "<tool_response>\n22 degrees and sunny\n</tool_response>" in turn2.prompt
    # the call's JSON-string arguments reach the template as an object (rendered once, not quoted)
    rendered = json.dumps(json.loads(call["function"]["arguments"]))
    assert f'"arguments": {rendered}}}' in turn2.prompt


def test_auto_calls_are_read_by_the_tool_call_parser(smollm2_path):
    llm = LLM(model=smollm2_path, max_model_len=512, tool_call_parser="hermes", chat_template=TOOLS_TEMPLATE)
    forced = SamplingParams(
        temperature=0, max_tokens=60, guided_decoding=GuidedDecodingParams(regex=FORCED_CALL_REGEX)
    )
    plain = SamplingParams(temperature=0, max_tokens=8)
    outputs = llm.chat([QUESTION, QUESTION], [forced, plain], use_tqdm=False, tools=TOOLS)
    ((name, arguments),) = calls_of(outputs[0])
    assert name == "get_weather" and outputs[0].outputs.text == "I will check."
    jsonschema.validate(arguments, SCHEMAS["get_weather"])
    assert calls_of(outputs[1]) == [] and outputs[1].outputs.text  # no call: plain text stays


@pytest.mark.parametrize(
    ("tools", "tool_choice", "words"),
    [
        (
            TOOLS,
            {"type": "function", "function": {"name": "get_stock"}},
            ["tool_choice", "get_stock", "get_weather"],
        ),
        (TOOLS, "auto", ["tool_choice", "tool_call_parser"]),
        (TOOLS, "sometimes", ["tool_choice", "sometimes"]),
        ([{"type": "function", "function": {"name": "ping"}}], "required", ["tools", "parameters", "ping"]),
        ([{"type": "function", "function": {"name": "bad name!"}}], None, ["tools[0].function.name"]),
        (None, "required", ["tool_choice", "tools"]),
    ],
)
def test_invalid_tools_fail_the_conversations_with_400(llm, tools, tool_choice, words):
    outputs = llm.chat([QUESTION, QUESTION], GREEDY, use_tqdm=False, tools=tools, tool_choice=tool_choice)
    for output in outputs:
        assert output.error_code == 400 and all(word in output.error_msg for word in words), output.error_msg


def test_forced_call_and_guided_decoding_conflict_fails_alone(llm):
    guided = SamplingParams(temperature=0, max_tokens=8, guided_decoding=GuidedDecodingParams(regex="a+"))
    outputs = llm.chat(
        [QUESTION, QUESTION], [guided, GREEDY], use_tqdm=False, tools=TOOLS, tool_choice="required"
    )
    assert outputs[0].error_code == 400 and "guided_decoding" in outputs[0].error_msg
    assert calls_of(outputs[1])
