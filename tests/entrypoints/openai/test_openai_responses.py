"""`POST /v1/responses` with the real `openai` client (`responses.create`, `responses.stream`,
`retrieve`, `delete`) against the test server process: answers equal the same greedy request
through `chat.completions` and the offline `LLM`, token counts equal the engine's, JSON outputs
validate against their schema, stored conversations continue, and a client that leaves a stream
frees its sequence."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
from openai_server_helpers import engine_idle, http_get, http_post, metric, wait_until

from fastdeploy import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tool_calling"))
from tool_fixtures import SCHEMAS, TOOLS  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "country": {"type": "string", "enum": ["France", "Italy", "Japan"]},
    },
    "required": ["name", "country"],
    "additionalProperties": False,
}


class City(pydantic.BaseModel):
    name: str
    country: Literal["France", "Italy", "Japan"]


#: the fixtures' tools in the Responses API's flat form
RESPONSE_TOOLS = [{"type": "function", **tool["function"]} for tool in TOOLS]
WEATHER_CHOICE = {"type": "function", "name": "get_weather"}


def respond(client, **kwargs):
    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("max_output_tokens", 16)
    return client.responses.create(model=MODEL, **kwargs)


def chat(client, messages, **kwargs):
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=messages, **kwargs)


def test_string_input_with_instructions_equals_chat_and_offline(client, llm):
    (expected,) = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    response = respond(client, input=QUESTION, instructions=SYSTEM)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == MODEL
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == expected.outputs.text
    assert response.output[0].content[0].type == "output_text"
    assert response.status == ("incomplete" if expected.outputs.finish_reason == "length" else "completed")
    usage = response.usage
    assert usage.input_tokens == len(expected.prompt_token_ids)
    assert usage.output_tokens == len(expected.outputs.token_ids)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_item_input_and_sampling_fields_equal_chat(client):
    """Content parts, `temperature` and `top_p` (and the `seed` extension) reach the engine as a
    chat request's do: the sampled answers are the same."""
    items = [
        {"role": "developer", "content": SYSTEM},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]
    sampled = {"temperature": 0.9, "top_p": 0.8, "extra_body": {"seed": 11}}
    response = respond(client, input=items, max_output_tokens=12, **sampled)
    expected = chat(client, CHAT, max_tokens=12, **sampled)
    assert response.output_text == expected.choices[0].message.content
    assert response.usage.input_tokens == expected.usage.prompt_tokens
    assert response.temperature == 0.9 and response.top_p == 0.8


def test_max_output_tokens_cuts_the_answer_as_incomplete(client):
    response = respond(client, input=QUESTION, max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.max_output_tokens == 3
    assert response.output[0].status == "incomplete"


def test_stream_sends_the_typed_event_sequence(client):
    expected = respond(client, input=QUESTION, instructions=SYSTEM, max_output_tokens=40)
    assert expected.status == "completed"  # the greedy answer ends before 40 tokens
    with client.responses.stream(
        model=MODEL, input=QUESTION, instructions=SYSTEM, max_output_tokens=40, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 3  # streamed piece by piece
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    text = "".join(event.delta for event in deltas)
    assert text == expected.output_text == final.output_text
    assert events[-4].text == text and {event.item_id for event in deltas} == {final.output[0].id}
    assert final.usage.output_tokens == expected.usage.output_tokens
    assert final.usage.input_tokens == expected.usage.input_tokens


def test_previous_response_id_continues_the_stored_conversation(client):
    first = respond(client, input="My name is Ada. Say hello to me.", max_output_tokens=12)
    second = respond(client, input="What is my name?", previous_response_id=first.id, max_output_tokens=12)
    messages = [
        {"role": "user", "content": "My name is Ada. Say hello to me."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    expected = chat(client, messages, max_tokens=12)
    assert second.output_text == expected.choices[0].message.content
    assert second.usage.input_tokens == expected.usage.prompt_tokens
    assert second.previous_response_id == first.id
    stored = client.responses.retrieve(first.id)
    assert stored.id == first.id and stored.output_text == first.output_text
    assert stored.usage.output_tokens == first.usage.output_tokens


def test_cached_tokens_are_the_whole_blocks_of_a_shared_prefix(client, llm):
    """Two requests with the same long instructions: the second's prompt starts with the first's
    KV blocks (64 tokens each), which `input_tokens_details.cached_tokens` reports."""
    instructions = "You answer questions about European geography. " * 20
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": instructions}, {"role": "user", "content": question}],
                tokenize=False,
            ),
            add_special_tokens=False,
        )
        for question in ("Where is Paris?", "Where is Rome?")
    ]
    shared = next(i for i, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)
    assert shared >= 128  # the instructions fill at least two blocks
    respond(client, input="Where is Paris?", instructions=instructions, max_output_tokens=2)
    second = respond(client, input="Where is Rome?", instructions=instructions, max_output_tokens=2)
    assert second.usage.input_tokens == len(prompts[1])
    assert second.usage.input_tokens_details.cached_tokens == shared // 64 * 64


def test_delete_and_store_false_leave_nothing_behind(client):
    kept = respond(client, input=QUESTION, max_output_tokens=4)
    assert client.responses.delete(kept.id) is None
    unstored = respond(client, input=QUESTION, max_output_tokens=4, store=False)
    assert unstored.store is False and kept.store is True
    for response_id in (kept.id, unstored.id):
        with pytest.raises(openai.NotFoundError) as caught:
            client.responses.retrieve(response_id)
        assert caught.value.body["code"] == "response_not_found"
        with pytest.raises(openai.NotFoundError) as caught:
            respond(client, input="again", previous_response_id=response_id)
        assert caught.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)


def test_text_format_json_schema_validates_and_equals_chat(client):
    fmt = {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}
    ask = "Describe the city of Paris as JSON."
    response = respond(client, input=ask, text={"format": fmt}, max_output_tokens=80)
    jsonschema.validate(json.loads(response.output_text), CITY)
    expected = chat(
        client,
        [{"role": "user", "content": ask}],
        max_tokens=80,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": CITY, "strict": True},
        },
    )
    assert response.output_text == expected.choices[0].message.content
    assert response.text.format.type == "json_schema"
    # the client's own helper: a pydantic model as the format, the answer parsed into it
    parsed = client.responses.parse(
        model=MODEL, input=ask, text_format=City, temperature=0, max_output_tokens=80
    ).output_parsed
    assert isinstance(parsed, City) and parsed.country in ("France", "Italy", "Japan")


def test_forced_tool_call_and_its_output_in_a_second_turn(client):
    question = "What is the weather like in Paris today?"
    response = respond(
        client, input=question, tools=RESPONSE_TOOLS, tool_choice=WEATHER_CHOICE, max_output_tokens=60
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), SCHEMAS["get_weather"])
    reference = chat(
        client,
        [{"role": "user", "content": question}],
        max_tokens=60,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ).choices[0]
    assert call.arguments == reference.message.tool_calls[0].function.arguments
    # the result goes back as a function_call_output, with the call in the input or stored
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees and sunny"}
    explicit = respond(
        client,
        input=[{"role": "user", "content": question}, call.model_dump(exclude_none=True), result],
        tools=RESPONSE_TOOLS,
        tool_choice="none",
    )
    continued = respond(
        client, input=[result], previous_response_id=response.id, tools=RESPONSE_TOOLS, tool_choice="none"
    )
    expected = chat(
        client,
        [
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "22 degrees and sunny"},
        ],
        max_tokens=16,
        tools=TOOLS,
        tool_choice="none",
    )
    assert explicit.output_text == continued.output_text == expected.choices[0].message.content
    assert explicit.usage.input_tokens == continued.usage.input_tokens == expected.usage.prompt_tokens


def test_streamed_required_call_sends_argument_events(client):
    with client.responses.stream(
        model=MODEL,
        input="What is the weather like in Paris today?",
        tools=RESPONSE_TOOLS,
        tool_choice="required",
        temperature=0,
        max_output_tokens=120,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.delta" in kinds
    done = [event for event in events if event.type == "response.function_call_arguments.done"]
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and [event.arguments for event in done] == [call.arguments for call in calls]
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_leaving_a_stream_aborts_it_and_frees_its_sequence(server):
    wait_until(lambda: engine_idle(server), 120, "an idle server")
    before = metric(server.metrics(), "fastdeploy:generation_tokens_total")
    payload = {
        "model": MODEL,
        "input": "Count: 1, 2, 3,",
        "max_output_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/responses", json=payload, timeout=60) as response:
        assert response.status_code == 200
        deltas = 0
        for line in response.iter_lines():
            if line == "event: response.output_text.delta":
                deltas += 1
                if deltas == 3:
                    assert metric(server.metrics(), "fastdeploy:num_requests_running") == 1
                    break
    wait_until(lambda: engine_idle(server), 60, "the abandoned stream's sequence to be freed")
    generated = metric(server.metrics(), "fastdeploy:generation_tokens_total") - before
    assert 3 <= generated < 900  # stopped early, not run to max_output_tokens


@pytest.mark.parametrize(
    ("payload", "status", "param", "fragment"),
    [
        (
            {"input": [{"role": "user", "content": "hi"}, {"role": "user", "content": 7}]},
            400,
            "input",
            "input[1]",
        ),
        ({"input": [{"type": "computer_call_output"}]}, 400, "input", "input[0].type"),
        ({"input": "hi", "previous_response_id": "resp_never"}, 404, "previous_response_id", "resp_never"),
        ({"input": "hi", "max_output_tokens": 5000}, 400, "max_output_tokens", "max_output_tokens=5000"),
        ({"input": "hi", "background": True}, 400, "background", "background"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools", "tools[0]"),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, 400, "text", "text.format"),
        ({"input": "hi", "temperature": True}, 400, "temperature", "boolean"),
        ({"input": "hi", "model": "gpt-5"}, 404, "model", "gpt-5"),
        ({}, 400, "input", "input must be"),
    ],
)
def test_bad_requests_follow_the_error_contract(server, payload, status, param, fragment):
    code, body = http_post(server.url + "/v1/responses", {"model": MODEL, **payload})
    assert code == status, body
    assert body["error"]["param"] == param and fragment in body["error"]["message"], body


def test_unknown_ids_are_404_on_get_and_delete(server):
    for method in ("GET", "DELETE"):
        response = httpx.request(method, server.url + "/v1/responses/resp_nothing", timeout=30)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "response_not_found"


def test_the_endpoints_appear_in_the_openapi_document(server):
    status, text = http_get(server.url + "/openapi.json")
    paths = json.loads(text)["paths"]
    assert {"/v1/responses", "/v1/responses/{response_id}", "/tokenize", "/detokenize"} <= paths.keys()
    assert {"get", "delete"} <= paths["/v1/responses/{response_id}"].keys()
    body = paths["/tokenize"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"prompt", "messages", "add_special_tokens", "add_generation_prompt"} <= body["properties"].keys()
    assert (
        "input"
        in paths["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"][
            "properties"
        ]
    )
