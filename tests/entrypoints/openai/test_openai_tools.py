"""Tool calling over HTTP with the real `openai` client: forced and parsed calls, streamed as
`delta.tool_calls` and accumulated by the client's own helpers, a two-turn conversation with a
tool result, and the 400s. An in-process server on SmolLM2 with the `hermes` tool-call parser and
a Qwen3-style template that renders tools (SmolLM2 speaks the same ChatML)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import jsonschema
import openai
import pytest
import uvicorn
from openai_server_helpers import HOST, free_port, http_post, wait_until

from fastdeploy import LLM
from fastdeploy.engine.async_engine import AsyncLLMEngine
from fastdeploy.entrypoints.openai.app import build_app
from fastdeploy.entrypoints.openai.metrics import ServerMetrics
from fastdeploy.entrypoints.openai.serving import ServingContext

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tool_calling"))
from tool_fixtures import FORCED_CALL_REGEX, QUESTION, SCHEMAS, TOOLS, TOOLS_TEMPLATE  # noqa: E402

WEATHER_CHOICE = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def url(smollm2_path):
    llm = LLM(
        model=smollm2_path,
        max_model_len=1024,
        max_num_seqs=8,
        tool_call_parser="hermes",
        chat_template=TOOLS_TEMPLATE,
    )
    engine = AsyncLLMEngine(llm.llm_engine)
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(ServingContext(engine, ["tools"], ServerMetrics())),
            host=HOST,
            port=free_port(),
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 120, "the in-process server")
    yield f"http://{HOST}:{server.config.port}"
    server.should_exit = True
    thread.join(60)


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def create(client, **kwargs):
    return client.chat.completions.create(
        model="tools",
        messages=kwargs.pop("messages", QUESTION),
        temperature=0,
        max_tokens=60,
        tools=TOOLS,
        **kwargs,
    )


def check_calls(calls) -> list[str]:
    for call in calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [call.function.name for call in calls]


def test_named_tool_choice(client):
    choice = create(client, tool_choice=WEATHER_CHOICE).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert check_calls(choice.message.tool_calls) == ["get_weather"]


def test_required_streamed_and_accumulated_by_the_client_helper(client):
    with client.chat.completions.stream(
        model="tools", messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=120
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in events and "tool_calls.function.arguments.done" in events
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and check_calls(choice.message.tool_calls)


def test_stream_deltas_in_openai_order(client):
    chunks = list(create(client, tool_choice=WEATHER_CHOICE, stream=True))
    deltas = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    first, rest = deltas[0], deltas[1:]
    assert (
        first.index == 0
        and first.id
        and first.function.name == "get_weather"
        and first.function.arguments == ""
    )
    assert rest and all(d.id is None and d.function.name is None and d.function.arguments for d in rest)
    arguments = "".join(d.function.arguments for d in rest)
    jsonschema.validate(json.loads(arguments), SCHEMAS["get_weather"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "tool_calls"
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_calls_are_parsed_from_the_model_format(client, stream):
    kwargs = {"tool_choice": "auto", "extra_body": {"guided_regex": FORCED_CALL_REGEX}}
    if stream:
        with client.chat.completions.stream(
            model="tools", messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=60, **kwargs
        ) as events:
            message = events.get_final_completion().choices[0].message
    else:
        message = create(client, **kwargs).choices[0].message
    assert message.content == "I will check." and check_calls(message.tool_calls) == ["get_weather"]


def test_two_turns_with_a_tool_result(client):
    first = create(client, tool_choice=WEATHER_CHOICE)
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"},
    ]
    second = create(client, messages=messages, tool_choice="none")
    choice = second.choices[0]
    assert (
        choice.finish_reason in ("stop", "length")
        and choice.message.content
        and not choice.message.tool_calls
    )
    # the prompt grew by the rendered call (`<tool_call>` block) and the `<tool_response>` block
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20


@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_stock"}}},
            "tool_choice",
            "get_stock",
        ),
        ({"tool_choice": "sometimes"}, "tool_choice", "sometimes"),
        (
            {"tools": [{"type": "function", "function": {"name": "ping"}}], "tool_choice": "required"},
            "tools",
            "parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
            "tools",
            "parameters",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools", "type"),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
            "tool_choice",
        ),
        (
            {
                "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
            },
            "tools",
            "Invalid type",
        ),
    ],
)
def test_invalid_tool_requests_are_400(url, fields, param, fragment):
    payload = {"model": "tools", "messages": QUESTION, "max_tokens": 4, "tools": TOOLS, **fields}
    status, body = http_post(url + "/v1/chat/completions", payload)
    assert status == 400, body
    assert body["error"]["param"] == param and fragment in body["error"]["message"], body


def test_auto_without_a_parser_is_400(server):
    payload = {"model": "SmolLM2-135M-Instruct", "messages": QUESTION, "tools": TOOLS, "tool_choice": "auto"}
    status, body = http_post(server.url + "/v1/chat/completions", payload)
    assert (
        status == 400
        and body["error"]["param"] == "tool_choice"
        and "--tool-call-parser" in body["error"]["message"]
    )
