"""The router when workers die, hang, recover, come and go: real processes on loopback.

The workers are stand-ins (standin_worker.py) that stop where a prompt tells them to, so "killed
mid-stream" and "killed before answering" happen exactly there, with no timing involved.
"""

from __future__ import annotations

import json
import os
import socket
import threading

import httpx
import pytest
from router_helpers import (
    HOST,
    http_get,
    kill,
    metric,
    standin_state,
    start_router,
    start_standin,
    wait_until,
    worker_health,
)


@pytest.fixture()
def pair():
    """Two fresh stand-in workers, a and b (a test may kill them)."""
    workers = [start_standin("a"), start_standin("b")]
    yield workers
    for worker in workers:
        worker.stop(5)


@pytest.fixture()
def router_factory():
    started = []

    def start(workers, *flags):
        router = start_router([worker.url for worker in workers], *flags)
        started.append(router)
        return router

    yield start
    for router in started:
        assert router.stop(10) == 0, router.output()


def events(response: httpx.Response):
    """The `data:` payloads of a server-sent event stream, as they arrive."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


def test_a_worker_killed_mid_stream_ends_the_stream_with_an_error_and_done_and_is_avoided(
    pair, router_factory
):
    a, b = pair
    router = router_factory(pair, "--policy", "round-robin")
    with httpx.Client(timeout=60) as client:
        payload = {"prompt": "hold-after-first@a hold-after-first@b", "stream": True}
        with client.stream("POST", router.url + "/v1/completions", json=payload) as response:
            assert response.status_code == 200
            stream = events(response)
            first = json.loads(next(stream))
            (victim, survivor), survivor_name = ((a, b), "b") if first["worker"] == "a" else ((b, a), "a")
            kill(victim)
            rest = list(stream)  # ends: the router does not wait for a worker that is gone
        assert len(rest) == 2, rest
        error = json.loads(rest[0])["error"]
        assert "the worker serving this stream failed" in error["message"]
        assert rest[1] == "[DONE]"

        served_by = [
            client.post(router.url + "/v1/completions", json={"prompt": "hi"}).json()["worker"]
            for _ in range(4)
        ]
    assert served_by == [survivor_name] * 4
    assert worker_health(router)[victim.url] == "unhealthy"
    text = http_get(router.url + "/metrics")[1]
    assert metric(text, "fastdeploy:router_requests_total", outcome="stream_failed", worker=victim.url) == 1
    assert metric(text, "fastdeploy:router_requests_total", outcome="ok", worker=survivor.url) == 4


@pytest.mark.parametrize(
    ("prompt", "stream"),
    [("hold-before-answer@a", False), ("hold-before-answer@a", True), ("hold-after-headers@a", True)],
    ids=["answer", "stream-before-headers", "stream-after-headers"],
)
def test_a_worker_killed_before_sending_anything_has_its_request_retried_elsewhere(
    pair, router_factory, prompt, stream
):
    a, b = pair
    router = router_factory(pair, "--policy", "round-robin")  # the first request goes to a
    answer = {}

    def send():
        with httpx.Client(timeout=60) as client:
            response = client.post(router.url + "/v1/completions", json={"prompt": prompt, "stream": stream})
            answer["status"], answer["text"] = response.status_code, response.text

    sender = threading.Thread(target=send)
    sender.start()
    wait_until(lambda: standin_state(a)["held"] == 1, 30, "worker a to hold the request")
    kill(a)
    sender.join(60)
    assert not sender.is_alive()
    assert answer["status"] == 200, answer
    if stream:
        payloads = [
            line[len("data: ") :] for line in answer["text"].splitlines() if line.startswith("data: ")
        ]
        assert [json.loads(p)["worker"] for p in payloads[:-1]] == ["b", "b", "b"]
        assert payloads[-1] == "[DONE]"
    else:
        assert json.loads(answer["text"])["worker"] == "b"
    assert standin_state(b)["requests"] == 1
    text = http_get(router.url + "/metrics")[1]
    assert metric(text, "fastdeploy:router_retries_total", worker=a.url) == 1


def test_a_client_leaving_mid_stream_closes_the_workers_stream(pair, router_factory):
    a, _ = pair
    router = router_factory(pair, "--policy", "round-robin")
    with httpx.Client(timeout=60) as client:
        payload = {"prompt": "hold-after-first@a", "stream": True}
        with client.stream("POST", router.url + "/v1/completions", json=payload) as response:
            stream = events(response)  # kept: dropping it would close the connection here
            assert json.loads(next(stream))["worker"] == "a"
            assert standin_state(a)["open_streams"] == 1
    # leaving the block closed the client's connection: the router must close its own to a
    wait_until(lambda: standin_state(a)["open_streams"] == 0, 30, "the worker's stream to be closed")
    outstanding = lambda: metric(  # noqa: E731
        http_get(router.url + "/metrics")[1], "fastdeploy:router_outstanding_requests", worker=a.url
    )
    wait_until(lambda: outstanding() == 0, 30, "the router to count the stream finished")


def test_a_client_leaving_before_the_answer_frees_the_request(pair, router_factory):
    a, _ = pair
    router = router_factory(pair, "--policy", "round-robin")
    body = json.dumps({"prompt": "hold-before-answer@a"}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
    with socket.create_connection((HOST, router.port)) as sock:
        sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: standin_state(a)["held"] == 1, 30, "worker a to hold the request")
    # the client went away while the worker still thinks: the router gives the request up
    outstanding = lambda: metric(  # noqa: E731
        http_get(router.url + "/metrics")[1], "fastdeploy:router_outstanding_requests", worker=a.url
    )
    wait_until(lambda: outstanding() == 0, 30, "the router to give up the request")


def test_an_unhealthy_worker_is_taken_out_and_put_back_when_it_recovers(pair, router_factory):
    a, b = pair
    router = router_factory(pair, "--policy", "round-robin")
    assert httpx.post(a.url + "/health/fail").status_code == 200
    wait_until(lambda: worker_health(router)[a.url] == "unhealthy", 30, "the router to take a out")
    with httpx.Client(timeout=60) as client:
        served = [
            client.post(router.url + "/v1/completions", json={"prompt": "x"}).json()["worker"]
            for _ in range(3)
        ]
        assert served == ["b", "b", "b"]
        assert client.post(a.url + "/health/ok").status_code == 200
        wait_until(lambda: worker_health(router)[a.url] == "healthy", 30, "the router to put a back")
        served = {
            client.post(router.url + "/v1/completions", json={"prompt": "x"}).json()["worker"]
            for _ in range(2)
        }
    assert served == {"a", "b"}


def test_no_healthy_worker_answers_503_and_streams_too(pair, router_factory):
    router = router_factory(pair)
    for worker in pair:
        httpx.post(worker.url + "/health/fail")
    wait_until(lambda: set(worker_health(router).values()) == {"unhealthy"}, 30, "both workers out")
    assert http_get(router.url + "/health")[0] == 503
    for stream in (False, True):
        response = httpx.post(
            router.url + "/v1/completions", json={"prompt": "x", "stream": stream}, timeout=60
        )
        assert response.status_code == 503
        assert "no worker is healthy" in response.json()["error"]["message"]


def test_the_workers_file_is_followed_while_the_router_runs(pair, router_factory, tmp_path):
    a, b = pair
    listing = tmp_path / "workers.txt"
    listing.write_text(f"# the pool\n{a.url}\n")
    router = start_router([], "--workers-file", str(listing), "--policy", "round-robin")
    try:
        assert worker_health(router) == {a.url: "healthy"}
        listing.write_text(f"{a.url}\n{b.url}  # added\n")
        wait_until(lambda: worker_health(router).get(b.url) == "healthy", 30, "the router to add b")
        with httpx.Client(timeout=60) as client:
            served = {
                client.post(router.url + "/v1/completions", json={"prompt": "x"}).json()["worker"]
                for _ in range(2)
            }
            assert served == {"a", "b"}
            listing.write_text(f"{b.url}\n")
            wait_until(lambda: list(worker_health(router)) == [b.url], 30, "the router to drop a")
            served = {
                client.post(router.url + "/v1/completions", json={"prompt": "x"}).json()["worker"]
                for _ in range(2)
            }
        assert served == {"b"}
    finally:
        assert router.stop(10) == 0


def open_sockets(pid: int) -> int:
    """How many sockets the process holds open (Linux /proc; a descriptor closed between the
    listing and its reading is not open)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            continue
    return count


def test_clients_leaving_and_workers_failing_leave_no_connections_or_processes(pair, router_factory):
    a, b = pair
    router = router_factory(pair, "--policy", "round-robin")
    pid = router.process.pid

    def leave_mid_stream() -> None:
        with httpx.Client(timeout=60) as client:
            payload = {"prompt": "hold-after-first@a hold-after-first@b", "stream": True}
            with client.stream("POST", router.url + "/v1/completions", json=payload) as response:
                stream = events(response)
                next(stream)

    leave_mid_stream()
    wait_until(
        lambda: standin_state(a)["open_streams"] + standin_state(b)["open_streams"] == 0, 30, "streams"
    )
    # kept-alive connections to the workers may vary by one or two; six leaks would add twelve
    baseline = open_sockets(pid) + 2
    for _ in range(6):
        leave_mid_stream()
    wait_until(
        lambda: standin_state(a)["open_streams"] + standin_state(b)["open_streams"] == 0, 30, "streams"
    )
    wait_until(lambda: open_sockets(pid) <= baseline, 30, f"the router's sockets back to {baseline}")
    kill(a)  # and a worker that dies under a request
    with httpx.Client(timeout=60) as client:
        for _ in range(4):
            assert client.post(router.url + "/v1/completions", json={"prompt": "x"}).json()["worker"] == "b"
    wait_until(lambda: open_sockets(pid) <= baseline, 30, f"the router's sockets back to {baseline}")
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        assert handle.read().split() == []  # the router starts no processes


def test_models_are_merged_by_id_and_the_authorization_header_reaches_the_worker(pair, router_factory):
    a, b = pair
    router = router_factory(pair, "--policy", "round-robin")
    with httpx.Client(timeout=60, headers={"Authorization": "Bearer client-key"}) as client:
        listed = client.get(router.url + "/v1/models").json()["data"]
        for _ in range(2):
            assert client.post(router.url + "/v1/completions", json={"prompt": "x"}).status_code == 200
    assert [model["id"] for model in listed] == ["shared-model", "model-a", "model-b"]
    assert standin_state(a)["authorization"] == ["Bearer client-key"]
    assert standin_state(b)["authorization"] == ["Bearer client-key"]
