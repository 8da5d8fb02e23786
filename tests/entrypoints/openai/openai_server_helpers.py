"""Starting a real server process on a loopback port, and small HTTP helpers for the tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable

HOST = "127.0.0.1"
#: arguments matching the shared `llm` fixture, so greedy answers can be compared with it
ENGINE_ARGS = ["--max-model-len", "1024", "--max-num-seqs", "32"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def http_post(url: str, payload: object, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", **(headers or {})}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metric(text: str, name: str, **labels: str) -> float:
    """The value of sample `name` with exactly these `labels` in Prometheus text."""
    selector = "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}" if labels else ""
    for line in text.splitlines():
        if line.startswith(name + selector + " "):
            return float(line.split()[-1])
    raise AssertionError(f"metric {name}{selector} not found")


def engine_idle(server: ServerProcess) -> bool:
    """Whether the server's engine runs and queues nothing and every KV block is free (metrics)."""
    text = server.metrics()
    return (
        metric(text, "fastdeploy:num_requests_running") == 0
        and metric(text, "fastdeploy:num_requests_waiting") == 0
        and metric(text, "fastdeploy:available_gpu_block_num")
        == metric(text, "fastdeploy:gpu_total_block_num")
    )


class ServerProcess:
    """`python -m <module> ... --port P` in its own process group, ready once /health answers."""

    def __init__(self, command: list[str], port: int, env: dict[str, str] | None = None) -> None:
        """`env`: variables added to this process's environment for the server."""
        self.port = port
        self.url = f"http://{HOST}:{port}"
        log_fd, self.log_path = tempfile.mkstemp(prefix="fastdeploy-server-", suffix=".log")
        self.process = subprocess.Popen(
            [sys.executable, *command, "--host", HOST, "--port", str(port), "--uvicorn-log-level", "warning"],
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        os.close(log_fd)
        try:
            wait_until(self._healthy, 180, f"the server on port {port} to become healthy")
        except AssertionError:
            self.stop()
            raise AssertionError(f"server did not start; its log:\n{self.output()}") from None

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"server exited with {self.process.returncode}:\n{self.output()}")
        try:
            return http_get(self.url + "/health")[0] == 200
        except OSError:
            return False

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")[1]

    def output(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then SIGKILL if it does not exit in `timeout` seconds; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode
