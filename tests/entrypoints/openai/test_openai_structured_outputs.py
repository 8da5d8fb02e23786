"""Structured outputs over HTTP with the real `openai` client: FastDeploy's `guided_*` fields,
OpenAI's `response_format`, vLLM's `structured_outputs`, streamed and not, and their 400s."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import openai
import pytest
from openai_server_helpers import http_post

from fastdeploy import SamplingParams

MODEL = "SmolLM2-135M-Instruct"
CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "country": {"type": "string", "enum": ["France", "Italy", "Japan"]},
        "population": {"type": "integer", "minimum": 0, "maximum": 50000000},
    },
    "required": ["name", "country", "population"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe the city of Paris as JSON."}]


def chat(client, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=80, **kwargs)


def test_guided_json_and_response_format_json_schema(client):
    for kwargs in (
        {"extra_body": {"guided_json": CITY}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": CITY, "strict": True},
            }
        },
        {"extra_body": {"structured_outputs": {"json": CITY}}},
    ):
        choice = chat(client, **kwargs).choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), CITY)


def test_streamed_json_schema_accumulates_to_a_valid_document(client):
    stream = chat(
        client,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), CITY)


def test_json_object(client):
    ask = [{"role": "user", "content": 'Reply with the JSON object {"cat": "Tom", "age": 3}.'}]
    response = client.chat.completions.create(
        model=MODEL, messages=ask, temperature=0, max_tokens=120, response_format={"type": "json_object"}
    )
    assert response.choices[0].finish_reason == "stop"
    content = response.choices[0].message.content
    assert isinstance(json.loads(content), dict)


def test_completions_regex_and_choice(client):
    regex = r"[0-9]{2}:[0-9]{2}"
    response = client.completions.create(
        model=MODEL,
        prompt="The train leaves at",
        max_tokens=10,
        temperature=0.8,
        seed=1,
        n=3,
        extra_body={"guided_regex": regex},
    )
    assert all(re.fullmatch(regex, choice.text) for choice in response.choices), response.choices
    choices = ["red", "green", "blue"]
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        response = client.completions.create(
            model=MODEL, prompt="My favourite colour is", max_tokens=5, extra_body=extra
        )
        assert response.choices[0].text in choices


def test_guided_grammar(client):
    grammar = 'start: "Answer: " ("yes" | "no")'
    response = client.completions.create(
        model=MODEL, prompt="Is water wet?", max_tokens=8, extra_body={"guided_grammar": grammar}
    )
    assert response.choices[0].text in ("Answer: yes", "Answer: no")


def body(**fields):
    return {"model": MODEL, "messages": ASK, "max_tokens": 4, **fields}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"guided_json": {"type": "objekt"}}, "guided_json", "Invalid type"),
        ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json", "uniqueItems"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_regex": "(ab"}, "guided_regex", "unclosed group"),
        ({"guided_choice": []}, "guided_choice", "non-empty list"),
        ({"guided_grammar": 'start: "a" |\n foo ::='}, "guided_grammar", "2(7)"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "response_format",
            "schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format", "xml"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "guided_regex and guided_choice"),
    ],
)
def test_invalid_constraints_are_400_naming_the_field(server, stream, fields, param, fragment):
    status, response = http_post(server.url + "/v1/chat/completions", body(stream=stream, **fields))
    assert status == 400, response
    error = response["error"]
    assert error["param"] == param and fragment in error["message"], error


def test_conflicting_bans_fail_that_request_alone(client, llm):
    """bad_words banning every digit the regex allows: 400 (and an error event when streamed)
    naming bad_words; streams running beside it in the same steps finish with their own tokens."""
    asks = [
        [{"role": "user", "content": f"Write one sentence about {topic}."}] for topic in ("rain", "bread")
    ]
    expected = [
        output.outputs.text
        for output in llm.chat(asks, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    ]
    conflicting = {
        "max_tokens": 8,
        "temperature": 0.8,
        "extra_body": {"guided_regex": "x[0-9]", "bad_words": list("0123456789")},
    }
    texts: dict[int, str] = {}
    started = threading.Barrier(3)  # the conflicting requests go out once both streams are running

    def stream(index: int) -> None:
        chunks = client.chat.completions.create(
            model=MODEL, messages=asks[index], temperature=0, max_tokens=32, stream=True
        )
        parts = []
        for chunk in chunks:
            if not parts:
                started.wait(timeout=120)
            parts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        texts[index] = "".join(parts)

    threads = [threading.Thread(target=stream, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    started.wait(timeout=120)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=ASK, **conflicting)
    with pytest.raises(openai.APIError) as event:
        for _ in client.chat.completions.create(model=MODEL, messages=ASK, stream=True, **conflicting):
            pass
    for thread in threads:
        thread.join()
    assert "bad_words" in refused.value.message and "no token can be generated" in refused.value.message
    assert "bad_words" in event.value.message
    assert refused.value.code == event.value.code == "guided_decoding_conflict"
    assert [texts[0], texts[1]] == expected
