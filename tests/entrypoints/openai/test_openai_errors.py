"""Error responses: OpenAI's JSON shape, the right status, and the parameter named."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai_server_helpers import http_get, http_post

MODEL = "SmolLM2-135M-Instruct"
CHAT = [{"role": "user", "content": "hi"}]


def completion(**fields):
    return {"model": MODEL, "prompt": "hello", "max_tokens": 2, **fields}


def chat(**fields):
    return {"model": MODEL, "messages": CHAT, "max_tokens": 2, **fields}


def assert_error(status, body, expected_status, param, fragment):
    assert status == expected_status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    assert fragment in error["message"], error
    return error


@pytest.mark.parametrize(
    ("path", "payload", "param", "fragment"),
    [
        ("/v1/completions", completion(temperature=-1), "temperature", "temperature must be in [0.0, 100.0]"),
        ("/v1/completions", completion(top_p=0), "top_p", "top_p must be in (0.0, 1.0]"),
        ("/v1/completions", completion(n=0), "n", "n must be >= 1"),
        ("/v1/completions", completion(max_tokens=0), "max_tokens", "max_tokens must be >= 1"),
        ("/v1/completions", completion(max_tokens="many"), "max_tokens", "valid integer"),
        ("/v1/completions", completion(presence_penalty=3), "presence_penalty", "[-2.0, 2.0]"),
        ("/v1/completions", completion(stop=[""]), "stop", "empty strings"),
        ("/v1/completions", completion(seed=-5), "seed", "seed must be in [0, 2**63)"),
        ("/v1/completions", completion(logprobs=50), "logprobs", "logprobs must be in [0, 20]"),
        ("/v1/completions", completion(prompt=""), "prompt", "empty string"),
        ("/v1/completions", completion(prompt=[]), "prompt", "must not be an empty list"),
        ("/v1/completions", completion(prompt=None), "prompt", "prompt is required"),
        ("/v1/completions", completion(prompt=[1, 10**9]), "prompt", "token ids must be in"),
        ("/v1/completions", completion(prompt=3.5), "prompt", "must be a str"),
        ("/v1/chat/completions", chat(messages=[]), "messages", "non-empty list"),
        ("/v1/chat/completions", chat(messages=[{"content": "no role"}]), "messages", "role"),
        ("/v1/chat/completions", chat(max_completion_tokens=0), "max_completion_tokens", ">= 1"),
        ("/v1/chat/completions", chat(logprobs=True, top_logprobs=99), "top_logprobs", "[0, 20]"),
        ("/v1/chat/completions", chat(top_logprobs=2), "top_logprobs", "needs logprobs"),
        ("/v1/chat/completions", chat(stream_options={"include_usage": True}), "stream_options", "stream"),
        (
            "/v1/chat/completions",
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
            "messages",
            "only takes text content",
        ),
    ],
)
def test_invalid_parameters_are_400_naming_the_parameter(server, path, payload, param, fragment):
    status, body = http_post(server.url + path, payload)
    error = assert_error(status, body, 400, param, fragment)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("/v1/completions", completion(logit_bias={"50256": -100}), "logit_bias"),
        ("/v1/completions", completion(suffix="tail"), "suffix"),
    ],
)
def test_unsupported_parameters_are_refused_not_ignored(server, path, payload, param):
    status, body = http_post(server.url + path, payload)
    error = assert_error(status, body, 400, param, "not support")
    assert error["code"] == "unsupported_parameter"


def test_supported_defaults_of_unsupported_features_pass(server):
    """Values that ask for nothing special (best_of == n, response_format text) are fine."""
    status, body = http_post(
        server.url + "/v1/chat/completions",
        chat(best_of=1, response_format={"type": "text"}, length_penalty=1.0),
    )
    assert status == 200, body


def test_prompt_longer_than_max_model_len(server):
    long_prompt = "hello " * 1100  # > 1024 tokens
    status, body = http_post(server.url + "/v1/completions", completion(prompt=long_prompt))
    error = assert_error(status, body, 400, "prompt", "maximum context length is 1024")
    assert error["code"] == "context_length_exceeded"
    long_chat = [{"role": "user", "content": long_prompt}]
    status, body = http_post(server.url + "/v1/chat/completions", chat(messages=long_chat))
    assert_error(status, body, 400, "messages", "maximum context length is 1024")


def test_malformed_bodies(server):
    status, body = http_post(server.url + "/v1/completions", b"{not json")
    assert_error(status, body, 400, None, "not valid JSON")
    status, body = http_post(server.url + "/v1/completions", b"[1, 2]")
    assert_error(status, body, 400, None, "JSON object")


def test_unknown_model_is_404(server, client):
    status, body = http_post(server.url + "/v1/completions", completion(model="gpt-4"))
    error = assert_error(status, body, 404, "model", "`gpt-4` does not exist")
    assert error["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=CHAT, max_tokens=2)


def test_openai_client_sees_bad_request_with_param(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=5000)
    assert info.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", extra_body={"use_beam_search": True})
    assert "beam search" in info.value.message


def test_unknown_route_is_an_openai_style_404(server):
    status, text = http_get(server.url + "/v1/no-such-endpoint")
    assert status == 404 and '"error"' in text


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("/v1/completions", completion(max_tokens=1_000_000_000), "max_tokens"),
        ("/v1/chat/completions", chat(max_tokens=1_000_000_000), "max_tokens"),
        ("/v1/chat/completions", chat(max_completion_tokens=5000), "max_completion_tokens"),
    ],
)
def test_max_tokens_beyond_the_context_is_400_naming_the_maximum(server, path, payload, param):
    small = {
        key: value for key, value in payload.items() if key not in ("max_tokens", "max_completion_tokens")
    }
    status, body = http_post(server.url + path, {**small, "max_tokens": 1})
    assert status == 200, body
    room = 1024 - body["usage"]["prompt_tokens"]
    status, body = http_post(server.url + path, payload)
    error = assert_error(status, body, 400, param, f"at most {room} tokens can be generated")
    assert "maximum context length is 1024 tokens" in error["message"]
    assert error["code"] == "context_length_exceeded"
    status, body = http_post(server.url + path, {**payload, param: room + 1})
    assert_error(status, body, 400, param, f"at most {room} tokens")
    # exactly what fits is accepted (the stream is left after its first event, which aborts it)
    with httpx.stream(
        "POST", server.url + path, json={**payload, param: room, "stream": True}, timeout=120
    ) as response:
        assert response.status_code == 200
        assert next(response.iter_lines()).startswith("data: ")


def test_default_max_tokens_is_cut_to_what_fits(server, llm):
    prompt = "hello " * 1015  # the completions default of 16 tokens does not fit after it
    prompt_tokens = len(llm.get_tokenizer().encode(prompt))
    assert 1024 - 16 < prompt_tokens < 1024
    status, body = http_post(server.url + "/v1/completions", {"model": MODEL, "prompt": prompt})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] <= 1024 - prompt_tokens


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_non_json_content_type_is_415(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    request = httpx.Request(
        "POST", server.url + "/v1/completions", content=json.dumps(completion()), headers=headers
    )
    assert request.headers.get("Content-Type") == content_type
    response = httpx.Client(timeout=60).send(request)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]


def test_json_content_type_with_parameters_is_accepted(server):
    response = httpx.post(
        server.url + "/v1/completions",
        content=json.dumps(completion()),
        headers={"Content-Type": "Application/JSON; charset=utf-8"},
        timeout=120,
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        (
            "cannot read /home/ops/models/secret-model/model.gguf: bad magic",
            "cannot read model.gguf: bad magic",
        ),
        ("file /etc/fastdeploy/key.txt missing", "file key.txt missing"),
        ("POST /v1/chat/completions failed", "POST /v1/chat/completions failed"),
        ("see http://host:8000/a/b/c", "see http://host:8000/a/b/c"),
        ("ratio 1/2/3 and ./relative/path", "ratio 1/2/3 and ./relative/path"),
    ],
)
def test_error_bodies_never_show_server_directories(message, shown):
    from fastdeploy.entrypoints.openai.errors import OpenAIError

    assert OpenAIError(500, message).body()["error"]["message"] == shown


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_prompt_of_megabytes_is_refused_without_tokenizing_it_all(server, path):
    text = "hello " * 1_000_000  # 6 MB: seconds of tokenizing before the length check
    body = (
        {"prompt": text, "max_tokens": 1}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    )
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (
        error["code"] == "context_length_exceeded"
        and "maximum context length of 1024 tokens" in error["message"]
    )


def test_error_messages_quoting_a_huge_value_are_cut(server):
    """A 4 MB model name is quoted in the 404; the answer stays small."""
    response = httpx.post(
        server.url + "/v1/completions", json={"model": "m" * 4_000_000, "prompt": "hi"}, timeout=60
    )
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert len(response.content) < 3000 and message.endswith("more characters cut)")
    assert message.startswith("The model `mmm")


def raw(fields: str, path: str = "/v1/completions") -> tuple[str, bytes]:
    """A request body written by hand (JSON a serializer would never produce)."""
    payload = chat() if path.endswith("chat/completions") else completion(prompt="hi")
    base = json.dumps(payload)[1:-1]
    return path, ("{" + base + (", " + fields if fields else "") + "}").encode()


CHAT_PATH = "/v1/chat/completions"


@pytest.mark.parametrize(
    ("request_", "param", "fragment"),
    [
        (raw('"max_tokens": NaN'), "max_tokens", "finite"),
        (raw('"temperature": Infinity'), "temperature", "finite"),
        (raw('"max_tokens": 1e400'), "max_tokens", "finite"),
        (raw('"max_tokens": 99999999999999999999999999'), "max_tokens", "at most 1023 tokens"),
        (raw('"seed": 99999999999999999999999'), "seed", "[0, 2**63)"),
        (raw('"n": 100000'), "n", "at most 128 samples"),
        (raw(f'"stop": {json.dumps([f"s{i}" for i in range(17)])}'), "stop", "17 stop strings are too many"),
        (raw(f'"stop": "{"x" * 257}"'), "stop", "257 characters is too long: at most 256"),
        (raw(f'"stop_token_ids": {list(range(257))}'), "stop_token_ids", "at most 256"),
        (raw(f'"bad_words": {json.dumps(["w"] * 129)}', CHAT_PATH), "bad_words", "at most 128"),
        (raw('"prompt": [[1, 2], [99999999]]'), "prompt", "token ids must be in"),
        (raw('"prompt": {"a": 1}'), "prompt", "without 'prompt'"),
        (
            raw('"prompt": {"prompt": "hi", "multi_modal_data": {"image": "x.png"}}'),
            "prompt",
            "takes text only",
        ),
        # 32 running + 1024 waiting: an idle server could never take 1057 (a 503 would be retried)
        (raw(f'"prompt": {json.dumps(["a"] * 1057)}'), "prompt", "1057 prompts in one request are more"),
        (raw('"stop": 5'), "stop", "valid string"),
        (raw('"temperature": true'), "temperature", "got the boolean true"),
        (raw('"n": false'), "n", "got the boolean false"),
        (raw('"logprobs": true'), "logprobs", "got the boolean true"),
        (raw('"max_completion_tokens": true', CHAT_PATH), "max_completion_tokens", "got the boolean true"),
        (raw('"stream_options": {"include_usage": "x"}, "stream": true'), "stream_options", "boolean"),
        (raw('"prompt": "\\ud800"'), None, "not valid JSON"),
        (("/v1/completions", b'{"prompt": "\xff\xfe"}'), None, "not valid JSON"),
        (("/v1/completions", b"[" * 100_000 + b"]" * 100_000), None, "not valid JSON"),
        (("/v1/completions", b"null"), None, "JSON object"),
        (("/v1/completions", b'"a string"'), None, "JSON object"),
        (raw('"model": 5'), "model", "valid string"),
        (raw('"messages": null', CHAT_PATH), "messages", "valid array"),
        (raw('"messages": [{}]', CHAT_PATH), "messages", "role"),
        (raw('"messages": [{"role": "user", "content": 5}]', CHAT_PATH), "messages", "got int"),
        (raw('"chat_template": "{{ raise_exception(\'no\') }}"', CHAT_PATH), "messages", "no"),
        (raw('"chat_template": "{% for x in range(10**9) %}a{% endfor %}"', CHAT_PATH), "messages", "range"),
        (raw('"chat_template": "{{ \'\'.__class__.__mro__ }}"', CHAT_PATH), "messages", "unsafe"),
        (raw('"chat_template": "{% if %}"', CHAT_PATH), "messages", "not valid Jinja"),
        (raw('"chat_template_kwargs": 5', CHAT_PATH), "chat_template_kwargs", "object"),
        (raw('"tools": 5', CHAT_PATH), "tools", "list of function tools"),
    ],
)
def test_hostile_bodies_are_400_naming_the_field(server, request_, param, fragment):
    """The hostile traffic script's malformed requests: each is a 400 in OpenAI's shape, none a 5xx
    or a hang (n=100000 once queued a hundred thousand sequences), and the server stays healthy."""
    path, body = request_
    response = httpx.post(
        server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60
    )
    assert_error(response.status_code, response.json(), 400, param, fragment)
    assert http_get(server.url + "/health")[0] == 200


def test_lists_at_their_bounds_are_served(server):
    """Stop strings, stop token ids and bad words are bounded (their cost is paid on every token of
    the engine thread), but requests at the bounds are served."""
    status, body = http_post(
        server.url + "/v1/completions",
        completion(
            n=2,
            stop=[f"{i:03d}" + "z" * 253 for i in range(16)],
            stop_token_ids=list(range(40000, 40256)),
            bad_words=[f"zq{i}" for i in range(128)],
        ),
    )
    assert status == 200, body
    assert len(body["choices"]) == 2
