"""Hostile traffic against a real `fastdeploy serve` process: oversized and stalled requests,
a flood of clients beyond the queue, and a SIGTERM while streams run past the drain deadline.

Nothing may hang, nothing may be cut mid-body, and every refusal is an answer a client can act on.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest
from openai_server_helpers import HOST, ServerProcess, free_port, http_get, metric, wait_until

from fastdeploy import SamplingParams

MODEL = "SmolLM2-135M-Instruct"
REQUEST_LIMIT = 4 * 1024 * 1024
READ_TIMEOUT = 1.0
MAX_NUM_SEQS = 16
MAX_WAITING = 48


@pytest.fixture(scope="module")
def hostile():
    process = ServerProcess(
        [
            "-m",
            "fastdeploy",
            "serve",
            "--max-model-len=1024",
            f"--max-num-seqs={MAX_NUM_SEQS}",
            f"--max-waiting-requests={MAX_WAITING}",
            "--max-request-size=4M",
            "--shutdown-timeout=2",
        ],
        free_port(),
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def stalling():
    """A server with 1 s read deadlines, for the stalled-client cases (apart from `hostile`: under
    a heavy load, a flood of 256 clients cannot always send every request head within 1 s)."""
    process = ServerProcess(
        [
            "-m",
            "fastdeploy",
            "serve",
            "--max-model-len=256",
            "--max-num-seqs=2",
            f"--header-timeout={READ_TIMEOUT}",
            f"--body-timeout={READ_TIMEOUT}",
        ],
        free_port(),
    )
    yield process
    process.stop()


def connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection((HOST, server.port), timeout=30)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails after the socket timeout)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_declared_oversized_body_gets_413_before_it_is_sent(hostile):
    with connect(hostile) as sock:
        sock.sendall(
            head(
                "POST",
                "/v1/completions",
                {"Content-Type": "application/json", "Content-Length": str(REQUEST_LIMIT + 1)},
            )
        )
        # not one byte of the body was sent, yet the answer comes
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 413
        error = json.loads(response.read())["error"]
    assert error["code"] == "request_too_large" and str(REQUEST_LIMIT) in error["message"]
    assert "--max-request-size" in error["message"]


def test_chunked_body_past_the_limit_gets_413(hostile):
    def chunks():
        piece = b"x" * 65536
        for _ in range(REQUEST_LIMIT // len(piece) + 2):
            yield piece

    response = httpx.post(
        hostile.url + "/v1/completions",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_stalled_request_head_gets_408_and_is_closed(stalling):
    with connect(stalling) as stalled:
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        # other clients are served while that connection stalls
        assert http_get(stalling.url + "/health")[0] == 200
        answer = read_until_closed(stalled).decode()
    assert answer.startswith("HTTP/1.1 408 Request Timeout")


def test_silent_connection_is_closed_after_the_header_timeout(stalling):
    with connect(stalling) as silent:
        assert read_until_closed(silent).startswith(b"HTTP/1.1 408")


def test_stalled_body_is_closed_and_logged_without_traceback(stalling):
    with connect(stalling) as stalled:
        stalled.sendall(
            head("POST", "/v1/completions", {"Content-Type": "application/json", "Content-Length": "100"})
            + b'{"prompt": '
        )
        assert read_until_closed(stalled) == b""  # closed, and nothing was answered to half a body
    wait_until(lambda: "request body stalled" in stalling.output(), 30, "the stalled body to be logged")
    assert "Traceback" not in stalling.output()


def test_health_answers_while_a_huge_prompt_is_tokenized(hostile):
    """A 2 MB message takes seconds to render and tokenize; that work runs off the event loop.
    Its first 8,192 characters (8 per token of the 1,024 of room) are a run of "=", a few hundred
    tokens, so the server's prefix probe cannot refuse it early and it is tokenized whole."""
    content = "=" * 8200 + "hello world " * 170_000
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}]})
    result: dict[str, httpx.Response] = {}

    def send_huge() -> None:
        result["huge"] = httpx.post(
            hostile.url + "/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=300,
        )

    sender = threading.Thread(target=send_huge)
    began = time.perf_counter()
    sender.start()
    latencies = []
    with httpx.Client(base_url=hostile.url, timeout=60) as client:
        while sender.is_alive():
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            latencies.append(time.perf_counter() - started)
    sender.join()
    took = time.perf_counter() - began
    assert result["huge"].status_code == 400
    assert result["huge"].json()["error"]["code"] == "context_length_exceeded"
    # tokenizing ~340k tokens takes seconds: a blocked loop would answer /health once, after
    # about all of them (the bound is relative, so a loaded machine's slow answers still pass)
    assert len(latencies) >= 5, latencies
    assert max(latencies) < max(2.0, took / 2), (took, latencies)


def test_256_clients_against_16_slots_are_served_or_refused_cleanly(hostile, llm):
    prompts = [f"List three facts about the number {i}." for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    expected = [o.outputs.text for o in llm.generate(prompts, params, use_tqdm=False)]

    async def one(client: httpx.AsyncClient, index: int) -> tuple[int, httpx.Response]:
        payload = {
            "model": MODEL,
            "prompt": prompts[index % 8],
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
        }
        return index, await client.post("/v1/completions", json=payload)

    async def flood() -> list[tuple[int, httpx.Response]]:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=hostile.url, timeout=600, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(256)))

    results = asyncio.run(flood())
    served = [(index, response) for index, response in results if response.status_code == 200]
    refused = [response for _, response in results if response.status_code == 503]
    assert len(served) + len(refused) == 256, {r.status_code for _, r in results}
    assert len(served) >= MAX_NUM_SEQS + MAX_WAITING  # the queue was used in full
    assert refused  # and beyond it, clients were told to come back
    for response in refused:
        assert response.headers["Retry-After"].isdigit()
        assert response.json()["error"]["code"] == "server_overloaded"
    for index, response in served:
        assert response.json()["choices"][0]["text"] == expected[index % 8]

    def idle() -> bool:
        text = hostile.metrics()
        return metric(text, "fastdeploy:num_requests_running") == 0 and metric(
            text, "fastdeploy:available_gpu_block_num"
        ) == metric(text, "fastdeploy:gpu_total_block_num")

    wait_until(idle, 60, "every KV block to be free again")


@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_of_more_prompts_than_the_queue_holds_is_refused_whole(hostile, stream):
    """100,000 prompts in one completions request: one 400 naming `prompt` before any is
    tokenized or queued (it used to queue the first 1,032 and run them before refusing the rest;
    then a 503, which clients retry although no server state could ever admit it)."""
    before = metric(hostile.metrics(), "fastdeploy:requests_number_total")
    payload = {"model": MODEL, "prompt": [[1, 2, 3]] * 100_000, "max_tokens": 4, "stream": stream}
    response = httpx.post(hostile.url + "/v1/completions", json=payload, timeout=120)
    assert response.status_code == 400 and "Retry-After" not in response.headers
    error = response.json()["error"]
    assert error["param"] == "prompt"
    assert f"{MAX_NUM_SEQS} running (--max-num-seqs) plus {MAX_WAITING} waiting" in error["message"]
    assert metric(hostile.metrics(), "fastdeploy:requests_number_total") == before
    if stream:
        return
    # exactly what fits is served
    fits = {**payload, "prompt": [[1, 2, 3]] * (MAX_NUM_SEQS + MAX_WAITING), "stream": False}
    response = httpx.post(hostile.url + "/v1/completions", json=fits, timeout=600)
    assert response.status_code == 200 and len(response.json()["choices"]) == MAX_NUM_SEQS + MAX_WAITING


def test_sigterm_past_the_deadline_ends_every_response_properly(hostile):
    """Runs last in this module: it stops the server. Streams outlive --shutdown-timeout=2."""
    long = {"model": MODEL, "max_tokens": 900, "ignore_eos": True, "temperature": 0}
    chat = {**long, "messages": [{"role": "user", "content": "Count to a thousand."}], "stream": True}
    outcomes: dict[str, object] = {}
    started = threading.Barrier(5, timeout=120)

    def stream(name: str, path: str, payload: dict) -> None:
        with httpx.stream("POST", hostile.url + path, json=payload, timeout=120) as response:
            lines = response.iter_lines()
            events = [next(line for line in lines if line.startswith("data: "))]
            started.wait()
            events += [line for line in lines if line.startswith("data: ")]
        outcomes[name] = [event[6:] for event in events]

    def sdk_stream() -> None:
        """What a user of the openai SDK sees: the stream ends without an exception."""
        client = openai.OpenAI(base_url=hostile.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        fields = {key: value for key, value in chat.items() if key != "ignore_eos"}
        chunks = client.chat.completions.create(**fields, extra_body={"ignore_eos": True})
        iterator = iter(chunks)
        received = [next(iterator)]
        started.wait()
        received += list(iterator)
        outcomes["sdk"] = [chunk.choices[0].finish_reason for chunk in received if chunk.choices]

    def plain() -> None:
        started.wait()
        outcomes["plain"] = httpx.post(
            hostile.url + "/v1/completions", json={**long, "prompt": "1, 2,"}, timeout=120
        )

    threads = [
        threading.Thread(target=stream, args=("chat", "/v1/chat/completions", chat)),
        threading.Thread(
            target=stream,
            args=("completion", "/v1/completions", {**long, "prompt": "1, 2, 3,", "stream": True}),
        ),
        threading.Thread(target=sdk_stream),
        threading.Thread(target=plain),
    ]
    for thread in threads:
        thread.start()
    started.wait()
    wait_until(lambda: metric(hostile.metrics(), "fastdeploy:num_requests_running") == 4, 60, "4 running")
    hostile.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(120)
    assert hostile.process.wait(60) == 0
    for name in ("chat", "completion"):
        events = outcomes[name]  # read to the end: a cut body would have raised in iter_lines
        assert events[-1] == "[DONE]", events[-3:]
        finishes = [
            json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1] if json.loads(e)["choices"]
        ]
        assert finishes[-1] == "abort" and all(f is None for f in finishes[:-1])
    assert outcomes["sdk"][-1] == "abort" and all(f is None for f in outcomes["sdk"][:-1])
    response = outcomes["plain"]
    assert response.status_code == 503 and response.headers["Retry-After"].isdigit()
    assert response.json()["error"]["code"] == "server_shutting_down"
    log = hostile.output()
    assert "shutdown timeout reached: aborting" in log
    assert "Traceback" not in log and "Exception in ASGI application" not in log
