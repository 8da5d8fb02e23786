"""Starting stand-in workers and routers as real processes on loopback, and reading their state."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints" / "openai"))

from openai_server_helpers import (  # noqa: E402
    ENGINE_ARGS,
    HOST,
    ServerProcess,
    free_port,
    http_get,
    http_post,
    metric,
    wait_until,
)

__all__ = [
    "ENGINE_ARGS",
    "HOST",
    "ServerProcess",
    "free_port",
    "http_get",
    "http_post",
    "metric",
    "wait_until",
]

STANDIN = str(Path(__file__).resolve().parent / "standin_worker.py")


def start_standin(name: str, *flags: str) -> ServerProcess:
    """A stand-in worker (standin_worker.py) in its own process; `flags` such as --role decode."""
    return ServerProcess([STANDIN, "--name", name, *flags], free_port())


def start_router(workers: list[str], *flags: str) -> ServerProcess:
    """`python -m fastdeploy router --workers ...` in its own process, ready once /health answers."""
    command = ["-m", "fastdeploy", "router", "--health-interval", "0.2", "--shutdown-timeout", "2"]
    if workers:
        command += ["--workers", *workers]
    return ServerProcess([*command, *flags], free_port())


def standin_state(worker: ServerProcess) -> dict:
    status, body = http_get(worker.url + "/state")
    assert status == 200, body
    return json.loads(body)


def kill(process: ServerProcess) -> None:
    """SIGKILL the process (and its group) at once: a worker dying, not shutting down."""
    os.killpg(process.process.pid, signal.SIGKILL)
    process.process.wait()


def worker_health(router: ServerProcess) -> dict[str, str]:
    """The router's view of its workers: URL -> "healthy" / "unhealthy"."""
    return json.loads(http_get(router.url + "/health")[1])["workers"]
