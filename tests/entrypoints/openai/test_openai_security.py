"""Security: the API key is compared in constant time, /metrics can require it, no request field
reaches the filesystem, and errors show no server paths."""

from __future__ import annotations

import hmac

import pytest
from openai_server_helpers import http_post
from scripted_engine import ScriptedEngine
from starlette.testclient import TestClient

from fastdeploy.engine.async_engine import AsyncLLMEngine
from fastdeploy.entrypoints.openai import app as app_module
from fastdeploy.entrypoints.openai.app import build_app
from fastdeploy.entrypoints.openai.metrics import ServerMetrics
from fastdeploy.entrypoints.openai.serving import ServingContext

KEY = "s3cret-key"


def client_for(**options) -> TestClient:
    engine = AsyncLLMEngine(ScriptedEngine())
    ctx = ServingContext(engine, ["scripted"], ServerMetrics(), api_key=KEY, **options)
    return TestClient(build_app(ctx))


def test_api_key_goes_through_a_constant_time_compare(monkeypatch):
    calls = []
    compare = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(app_module.hmac, "compare_digest", spy)
    with client_for() as client:
        assert client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert calls == [(b"nope", KEY.encode()), (KEY.encode(), KEY.encode())]


@pytest.mark.parametrize("protected", [False, True])
def test_metrics_can_require_the_key(protected):
    with client_for(metrics_require_api_key=protected) as client:
        open_status = client.get("/metrics").status_code
        keyed = client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
        assert client.get("/health").status_code == 200  # probes never need the key
    assert open_status == (401 if protected else 200)
    assert keyed.status_code == 200 and "fastdeploy:num_requests_running" in keyed.text


def test_401_does_not_echo_the_key_or_the_attempt():
    with client_for() as client:
        body = client.post(
            "/v1/completions", json={"prompt": "hi"}, headers={"Authorization": "Bearer guess-1234"}
        ).text
    assert KEY not in body and "guess-1234" not in body


def test_a_request_chat_template_is_refused_unless_the_server_trusts_them():
    """A template is a program: nested loops or string repetition would hold a preprocessing
    thread, and the server, for good; by default a request's own template is a 400."""
    hostile = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template": hostile, "max_tokens": 1}
    with client_for() as client:
        response = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "chat_template" and "--trust-request-chat-template" in error["message"]


def test_a_request_chat_template_is_template_text_never_a_file(server, llm, tmp_path):
    secret = tmp_path / "template.jinja"
    secret.write_text("SECRET CONTENT {{ messages[0]['content'] }} " * 20)
    status, body = http_post(
        server.url + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "chat_template": str(secret),
            "max_tokens": 1,
        },
    )
    assert status == 200, body
    # the prompt was the path's own text, rendered as a (constant) template
    expected = len(llm.get_tokenizer().encode(str(secret), add_special_tokens=False))
    assert body["usage"]["prompt_tokens"] == expected


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/resp_x"),
        ("DELETE", "/v1/responses/resp_x"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
    ],
)
def test_responses_and_tokenizer_endpoints_need_the_key(method, path):
    with client_for() as client:
        response = client.request(method, path, json={"input": "hi", "prompt": "hi", "tokens": [1]})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_tokenize_refuses_a_request_chat_template_unless_trusted():
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages }}"}
    with client_for() as client:
        response = client.post("/tokenize", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "chat_template"
