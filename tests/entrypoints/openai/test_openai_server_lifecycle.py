"""`fastdeploy serve` with an API key, several names, a metrics port and a small queue; overload
(503) and SIGTERM shutdown on a real process."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket

import httpx
import openai
import pytest
from openai_server_helpers import HOST, ServerProcess, free_port, http_get, http_post, metric, wait_until

KEY = "test-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: the seed's vLLM launch flags that have no meaning here must still be accepted
SEED_FLAGS = [
    "--num-scheduler-steps=8",
    "--trust-remote-code",
    "--enforce-eager",
    "--gpu-memory-utilization=0.9",
]


@pytest.fixture(scope="module")
def guarded():
    metrics_port = free_port()
    process = ServerProcess(
        [
            "-m",
            "fastdeploy",
            "serve",
            "--max-model-len=512",
            "--max-num-seqs=2",
            "--max-waiting=1",
            f"--metrics-port={metrics_port}",
            f"--api-key={KEY}",
            "--served-model-name",
            "my-model",
            "other-name",
            "--shutdown-timeout=120",
            *SEED_FLAGS,
        ],
        free_port(),
    )
    process.metrics_port = metrics_port
    yield process
    process.stop()


def chat_payload(**fields):
    return {"model": "my-model", "messages": [{"role": "user", "content": "Count to ten."}], **fields}


def test_api_key_is_required_on_v1_routes(guarded):
    status, body = http_post(guarded.url + "/v1/chat/completions", chat_payload(max_tokens=2))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert "missing" in body["error"]["message"]
    status, body = http_get(guarded.url + "/v1/models", {"Authorization": "Bearer wrong"})
    assert status == 401 and "not valid" in body
    bad_client = openai.OpenAI(base_url=guarded.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_client.models.list()
    assert http_get(guarded.url + "/health")[0] == 200
    assert http_get(guarded.url + "/metrics")[0] == 200


def raw_request(
    server: ServerProcess, method: str, path: str, headers: list[bytes], body: bytes = b""
) -> bytes:
    """Send exactly these bytes (no client library normalises them) and read the whole answer."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: x", b"Connection: close", *headers]
    if body:
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    with socket.create_connection((HOST, server.port), timeout=60) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


AUTH_VARIANTS = [
    [],
    [b"Authorization: Bearer wrong"],
    [b"Authorization: Bearer"],
    [b"Authorization: Bearer "],
    [b"Authorization: Basic " + base64.b64encode(KEY.encode())],
    [b"Authorization: Basic " + base64.b64encode(b"user:" + KEY.encode())],
    [f"Authorization: Bearer {KEY}x".encode()],
    [f"Authorization: Bearer {KEY[:-1]}".encode()],
    [f"Authorization: Bearer {KEY.upper()}".encode()],
    [f"Authorization: {KEY}".encode()],
    [f"Authorization: Token {KEY}".encode()],
    [f"Authorization: Bearer\t{KEY}".encode()],
    [f'Authorization: Bearer "{KEY}"'.encode()],
    [f"Authorization: Bearer {KEY},Bearer {KEY}".encode()],
    [b"Authorization: Bearer wrong", f"Authorization: Bearer {KEY}".encode()],
    [b"Authorization: Bearer t\xe9st-secret"],
    [b"Authorization: Bearer " + b"a" * 8000],
    [f"X-API-Key: {KEY}".encode()],
    [f"Api-Key: {KEY}".encode()],
    [f"Proxy-Authorization: Bearer {KEY}".encode()],
    [f"Cookie: api_key={KEY}".encode()],
    [f"Authorization: Bearer {KEY}\x00".encode()],
]


@pytest.mark.parametrize("headers", AUTH_VARIANTS, ids=range(len(AUTH_VARIANTS)))
@pytest.mark.parametrize("route", ["POST /v1/completions", "GET /v1/models", "GET /v1/models?api_key=KEY"])
def test_every_wrong_credential_is_refused(guarded, headers, route):
    """The hostile script's auth variants: none gets through, none is echoed back."""
    method, path = route.replace("KEY", KEY).split()
    body = (
        json.dumps({"model": "my-model", "prompt": "hi", "max_tokens": 1}).encode()
        if method == "POST"
        else b""
    )
    answer = raw_request(guarded, method, path, headers, body)
    status = answer.split(b"\r\n", 1)[0]
    # a NUL byte is not even valid HTTP (400 before the app); everything else is the app's 401
    assert status == (
        b"HTTP/1.1 400 Bad Request" if b"\x00" in b"".join(headers) else b"HTTP/1.1 401 Unauthorized"
    )
    response_body = answer.split(b"\r\n\r\n", 1)[1]
    assert KEY.encode() not in response_body and KEY.upper().encode() not in response_body


def test_served_model_names(guarded):
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    assert [model.id for model in client.models.list().data] == ["my-model", "other-name"]
    response = client.chat.completions.create(
        model="other-name", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert response.model == "other-name" and response.usage.completion_tokens == 2
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", max_tokens=2)


def test_metrics_port_serves_prometheus_text(guarded):
    status, text = http_get(f"http://{HOST}:{guarded.metrics_port}/metrics")
    assert status == 200
    assert metric(text, "fastdeploy:gpu_total_block_num") > 0
    assert "fastdeploy:time_to_first_token_seconds_bucket" in text


def test_overload_beyond_max_waiting_is_503(guarded):
    streams = []
    with contextlib.ExitStack() as stack:
        for _ in range(3):  # 2 running (--max-num-seqs) + 1 waiting (--max-waiting)
            response = stack.enter_context(
                httpx.stream(
                    "POST",
                    guarded.url + "/v1/chat/completions",
                    json=chat_payload(max_tokens=400, ignore_eos=True, stream=True),
                    headers=AUTH,
                    timeout=120,
                )
            )
            assert response.status_code == 200
            streams.append(response)

        def queue_is_full() -> bool:
            text = guarded.metrics()
            running = metric(text, "fastdeploy:num_requests_running")
            return running == 2 and metric(text, "fastdeploy:num_requests_waiting") == 1

        wait_until(queue_is_full, 120, "2 running and 1 waiting requests")
        response = httpx.post(
            guarded.url + "/v1/chat/completions", json=chat_payload(max_tokens=2), headers=AUTH, timeout=60
        )
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] == "1"
        error = response.json()["error"]
        assert error["code"] == "server_overloaded" and "--max-waiting-requests" in error["message"]
    # the three streams were closed: their requests are aborted and capacity comes back
    wait_until(
        lambda: metric(guarded.metrics(), "fastdeploy:num_requests_running") == 0,
        60,
        "the streams to be aborted",
    )
    status, body = http_post(guarded.url + "/v1/chat/completions", chat_payload(max_tokens=2), AUTH)
    assert status == 200, body


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_drains_running_requests_and_exits_cleanly(guarded):
    """Runs last in this module: it stops the server."""
    payload = chat_payload(
        max_tokens=12, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    with httpx.stream(
        "POST", guarded.url + "/v1/chat/completions", json=payload, headers=AUTH, timeout=120
    ) as response:
        lines = response.iter_lines()
        chunks = []
        for line in lines:
            if line.startswith("data: ") and '"content": "' in line and '"content": ""' not in line:
                chunks.append(json.loads(line[6:]))
                break
        guarded.process.send_signal(signal.SIGTERM)
        wait_until(lambda: refuses_connections(guarded.port), 30, "the listening socket to close")
        events = [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks += [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 12  # the running request finished in full
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length"
    assert guarded.process.wait(120) == 0
    with pytest.raises(ProcessLookupError):  # nothing left in the server's process group
        os.killpg(guarded.process.pid, 0)
    assert "engine thread stopped" in guarded.output()


def test_a_port_in_use_fails_before_the_model_loads(capsys):
    """The port is bound first: with it taken, the error names it, although the model path does
    not exist either (loading first would have failed on the model instead)."""
    from fastdeploy.entrypoints.openai.api_server import main

    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["--model", "/nonexistent/model", "--host", HOST, "--port", str(port)])
    assert status == 2
    error = capsys.readouterr().err
    assert f"cannot listen on {HOST}:{port}" in error and "model" not in error.split("cannot listen")[0]
