"""The router across hosts: a client, the router and two `fastdeploy serve` workers, each in a
network namespace of its own joined by veth pairs, each reached over its own address.

    client 10.231.1.2 --- 10.231.1.1 router 10.231.2.1 --- 10.231.2.2 worker A
                                            10.231.3.1 --- 10.231.3.2 worker B

The test creates the namespaces, links and addresses, sends traffic only to those addresses, and
deletes the namespaces (with their links) afterwards, failed or not. It needs root and `ip`.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request

import openai
import pytest
from router_helpers import ENGINE_ARGS, metric, wait_until

pytestmark = [
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0, reason="network namespaces need root"
    ),
    pytest.mark.skipif(shutil.which("ip") is None, reason="the `ip` command (iproute2) is not installed"),
]

CLONE_NEWNET = 0x40000000
PORT = 8000
ROUTER = "http://10.231.1.1:8080"
WORKERS = {"a": "10.231.2.2", "b": "10.231.3.2"}


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """The namespaces (client, router, a, b), the processes started in them, and a thread that
    lives in the client's namespace to make requests from there."""

    def __init__(self) -> None:
        prefix = f"fdr{os.getpid()}"
        self.names = {role: f"{prefix}{role}" for role in ("client", "router", "a", "b")}
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self._client_thread = concurrent.futures.ThreadPoolExecutor(
            1, initializer=self._enter_client_namespace
        )

    def create(self) -> None:
        for name in self.names.values():
            ip("netns", "add", name)
            ip("-n", name, "link", "set", "lo", "up")
        self._link("client", "10.231.1.2", "router", "10.231.1.1")
        self._link("router", "10.231.2.1", "a", "10.231.2.2")
        self._link("router", "10.231.3.1", "b", "10.231.3.2")

    def _link(self, left: str, left_address: str, right: str, right_address: str) -> None:
        """A veth pair from `left`'s namespace to `right`'s, with a /24 address at each end."""
        left_ns, right_ns = self.names[left], self.names[right]
        left_dev, right_dev = f"to-{right}", f"to-{left}"
        ip(
            "-n",
            left_ns,
            "link",
            "add",
            left_dev,
            "type",
            "veth",
            "peer",
            "name",
            right_dev,
            "netns",
            right_ns,
        )
        for ns, dev, address in ((left_ns, left_dev, left_address), (right_ns, right_dev, right_address)):
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")

    def start(self, role: str, command: list[str]) -> None:
        """`ip netns exec <role's namespace> python COMMAND`, in its own process group."""
        log_fd, self.logs[role] = tempfile.mkstemp(prefix=f"fastdeploy-netns-{role}-", suffix=".log")
        self.processes[role] = subprocess.Popen(
            ["ip", "netns", "exec", self.names[role], sys.executable, *command],
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        os.close(log_fd)

    def output(self, role: str) -> str:
        with open(self.logs[role], encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def kill(self, role: str) -> None:
        process = self.processes[role]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def from_client(self, function, *args):
        """`function(*args)` run in the client's namespace."""
        return self._client_thread.submit(function, *args).result()

    def wait_healthy(self, role: str, url: str) -> None:
        def healthy() -> bool:
            if self.processes[role].poll() is not None:
                raise AssertionError(f"{role} exited:\n{self.output(role)}")
            return self.from_client(status_of, url + "/health") == 200

        wait_until(healthy, 300, f"{role} at {url} to become healthy", interval=0.2)

    def _enter_client_namespace(self) -> None:
        with open(f"/var/run/netns/{self.names['client']}") as handle:
            if ctypes.CDLL(None, use_errno=True).setns(handle.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the client's namespace failed")

    def remove(self) -> None:
        for role in list(self.processes):
            self.kill(role)
        self._client_thread.shutdown()
        for name in self.names.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except OSError:
        return 0


def text_of(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def hosts():
    hosts = Hosts()
    try:
        try:
            hosts.create()
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
