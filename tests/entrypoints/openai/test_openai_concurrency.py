"""Many clients at once: correct, independent answers, batched together; disconnects free KV blocks."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
from openai_server_helpers import HOST, engine_idle, metric, wait_until

from fastdeploy import SamplingParams

MODEL = "SmolLM2-135M-Instruct"
TOPICS = ["the sea", "a cat", "Paris", "music", "the moon", "bread", "winter", "trains"]


def test_32_concurrent_streaming_clients_are_batched_and_independent(server, client, llm):
    prompts = [f"Write one sentence about {TOPICS[i % 8]} number {i}." for i in range(32)]
    completions, chats = prompts[:16], prompts[16:]
    params = SamplingParams(temperature=0, max_tokens=8)
    expected = [o.outputs.text for o in llm.generate(completions, params, use_tqdm=False)]
    conversations = [[{"role": "user", "content": prompt}] for prompt in chats]
    expected += [o.outputs.text for o in llm.chat(conversations, params, use_tqdm=False)]

    results: dict[int, str] = {}
    failures: list[BaseException] = []
    bad_request: list[BaseException] = []
    start = threading.Barrier(33)

    def stream_completion(index: int) -> None:
        start.wait()
        stream = client.completions.create(
            model=MODEL, prompt=prompts[index], max_tokens=8, temperature=0, stream=True
        )
        results[index] = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

    def stream_chat(index: int) -> None:
        start.wait()
        stream = client.chat.completions.create(
            model=MODEL, messages=conversations[index - 16], max_tokens=8, temperature=0, stream=True
        )
        results[index] = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    def misbehave() -> None:
        start.wait()
        try:
            client.completions.create(model=MODEL, prompt="x", temperature=-3, stream=True)
        except openai.BadRequestError as exc:
            bad_request.append(exc)

    def guarded(target, *args):
        def run():
            try:
                target(*args)
            except BaseException as exc:
                failures.append(exc)

        return threading.Thread(target=run)

    threads = [guarded(stream_completion if i < 16 else stream_chat, i) for i in range(32)]
    threads.append(guarded(misbehave))
    for thread in threads:
        thread.start()
    peak = 0.0

    def all_done_or_peak_seen() -> bool:
        nonlocal peak
        peak = max(peak, metric(server.metrics(), "fastdeploy:num_requests_running"))
        return peak > 1 or not any(thread.is_alive() for thread in threads)

    wait_until(all_done_or_peak_seen, 300, "the clients to run")
    for thread in threads:
        thread.join(300)
    assert not failures, failures
    assert len(bad_request) == 1 and bad_request[0].param == "temperature"
    assert [results[i] for i in range(32)] == expected
    assert peak > 1, "the server never ran more than one request at once"
    metrics = server.metrics()
    batched_steps = metric(metrics, "fastdeploy:requests_per_step_count") - metric(
        metrics, 'fastdeploy:requests_per_step_bucket{le="1.0"}'
    )
    assert batched_steps > 0


def test_disconnecting_stream_aborts_and_frees_blocks(server):
    wait_until(lambda: engine_idle(server), 120, "an idle server")
    before = metric(server.metrics(), "fastdeploy:generation_tokens_total")
    payload = {
        "model": MODEL,
        "prompt": "Count: 1, 2, 3,",
        "max_tokens": 900,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=payload, timeout=60) as response:
        assert response.status_code == 200
        received = 0
        for line in response.iter_lines():
            if line.startswith("data: "):
                received += 1
                if received == 3:
                    text = server.metrics()
                    assert metric(text, "fastdeploy:num_requests_running") == 1
                    assert metric(text, "fastdeploy:available_gpu_block_num") < metric(
                        text, "fastdeploy:gpu_total_block_num"
                    )
                    break
    wait_until(lambda: engine_idle(server), 60, "the aborted request's blocks to be freed")
    generated = metric(server.metrics(), "fastdeploy:generation_tokens_total") - before
    assert 3 <= generated < 900  # stopped early, not run to max_tokens


def test_disconnecting_non_streaming_request_aborts_it(server):
    wait_until(lambda: engine_idle(server), 120, "an idle server")
    before = metric(server.metrics(), "fastdeploy:generation_tokens_total")
    body = json.dumps({"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 900, "ignore_eos": True})
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    with socket.create_connection((HOST, server.port)) as sock:
        sock.sendall(request)
        wait_until(
            lambda: metric(server.metrics(), "fastdeploy:generation_tokens_total") > before + 2,
            60,
            "the request to generate",
        )
    wait_until(lambda: engine_idle(server), 60, "the abandoned request's blocks to be freed")
    assert metric(server.metrics(), "fastdeploy:generation_tokens_total") - before < 900
