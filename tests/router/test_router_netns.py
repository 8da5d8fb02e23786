"""The router across hosts: a client, the router and two `fastdeploy serve` workers, each in a
network namespace of its own joined by veth pairs, each reached over its own address.

    client 10.231.1.2 --- 10.231.1.1 router 10.231.2.1 --- 10.231.2.2 worker A
                                            10.231.3.1 --- 10.231.3.2 worker B

The test creates the namespaces, links and addresses, sends traffic only to those addresses, and
deletes the namespaces (with their links) afterwards, failed or not. It needs root and `ip`.
"""

from __future__ import annotations

import json
import subprocess

import openai
import pytest
from netns_hosts import NETNS_SKIPS, Hosts, status_of, text_of
from router_helpers import ENGINE_ARGS, metric, wait_until

pytestmark = NETNS_SKIPS

PORT = 8000
ROUTER = "http://10.231.1.1:8080"
WORKERS = {"a": "10.231.2.2", "b": "10.231.3.2"}


@pytest.fixture(scope="module")
def hosts():
    hosts = Hosts(["client", "router", "a", "b"], "fdr")
    try:
        try:
            hosts.create(
                [
                    ("client", "10.231.1.2", "router", "10.231.1.1"),
                    ("router", "10.231.2.1", "a", "10.231.2.2"),
                    ("router", "10.231.3.1", "b", "10.231.3.2"),
                ]
            )
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
        for role, address in WORKERS.items():
            hosts.start(
                role, ["-m", "fastdeploy", "serve", *ENGINE_ARGS, "--host", address, "--port", str(PORT)]
            )
        workers = [f"http://{address}:{PORT}" for address in WORKERS.values()]
        hosts.start(
            "router",
            [
                "-m",
                "fastdeploy",
                "router",
                "--host",
                "10.231.1.1",
                "--port",
                "8080",
                "--startup-timeout",
                "300",
            ]
            + ["--health-interval", "0.5", "--workers", *workers],
        )
        hosts.wait_healthy("router", ROUTER)
        for address in WORKERS.values():  # the client reaches workers only through the router
            assert hosts.from_client(status_of, f"http://{address}:{PORT}/health") == 0
        wait_until(
            lambda: (
                set(json.loads(hosts.from_client(text_of, ROUTER + "/health"))["workers"].values())
                == {"healthy"}
            ),
            300,
            "both workers to be healthy",
            interval=0.2,
        )
        yield hosts
    finally:
        hosts.remove()


def completion(prompt: str, max_tokens: int = 8, **extra):
    """A greedy completion from the router (run it in the client's namespace)."""
    client = openai.OpenAI(base_url=ROUTER + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    return client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, **extra
    )


def test_both_worker_hosts_answer_alike_through_the_router(hosts):
    answers = [hosts.from_client(completion, "The capital of France is").choices[0].text for _ in range(2)]
    assert answers[0] == answers[1] and answers[0]
    metrics = hosts.from_client(text_of, ROUTER + "/metrics")
    for address in WORKERS.values():  # least-outstanding rotated them over both hosts
        assert (
            metric(
                metrics, "fastdeploy:router_requests_total", outcome="ok", worker=f"http://{address}:{PORT}"
            )
            >= 1
        )
    streamed = hosts.from_client(
        lambda: "".join(
            chunk.choices[0].text
            for chunk in completion("The capital of France is", stream=True)
            if chunk.choices
        )
    )
    assert streamed == answers[0]


def stream_until_killed(hosts: Hosts) -> tuple[str, list[str]]:
    """Start a long stream; when its first chunk arrives, kill the worker host serving it; return
    that worker's role and what the stream did next."""
    stream = completion(
        "Tell me a long story.", stream=True, max_tokens=1000, extra_body={"ignore_eos": True}
    )
    iterator = iter(stream)
    next(iterator)
    metrics = text_of(ROUTER + "/metrics")
    busy = [
        role
        for role, address in WORKERS.items()
        if metric(metrics, "fastdeploy:router_outstanding_requests", worker=f"http://{address}:{PORT}") == 1
    ]
    assert len(busy) == 1, metrics
    hosts.kill(busy[0])
    try:
        rest = [chunk.choices[0].text for chunk in iterator if chunk.choices]
    except openai.APIError as exc:  # the router's error event: the stream ended, not hung
        return busy[0], [f"error: {exc.message}"]
    return busy[0], rest


def test_a_worker_host_killed_mid_stream_ends_the_stream_and_the_other_host_serves_on(hosts):
    killed, rest = hosts.from_client(stream_until_killed, hosts)
    assert rest and rest[-1].startswith("error: the worker serving this stream failed"), rest
    answers = {hosts.from_client(completion, "Hello").choices[0].text for _ in range(3)}
    assert len(answers) == 1
    health = json.loads(hosts.from_client(text_of, ROUTER + "/health"))["workers"]
    assert health[f"http://{WORKERS[killed]}:{PORT}"] == "unhealthy"
    survivor = next(role for role in WORKERS if role != killed)
    assert hosts.processes[survivor].poll() is None
