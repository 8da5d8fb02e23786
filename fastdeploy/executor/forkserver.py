"""A fork server: one fresh interpreter imports what a rank needs once, then forks every rank.

A rank started as a fresh interpreter spends most of its start-up importing: fastdeploy's model
code and plugins, and the collectives runtime (`import paddle` alone is about 1 s here). With N
ranks on one host that is N times the same work, on cores the ranks share with each other and
with the engine. The fork server does it once and forks the ranks from that state, so they go
straight to loading their shards.

Forking is safe here because the server does nothing else: it is a fresh interpreter (not the
engine, whose threads, OpenMP and BLAS pools a fork would copy half-way), it has only imported,
and the one thread an import starts (OpenBLAS's pool, which OpenBLAS stops around a fork) runs
no work. Only host backends use it, on Linux: a device backend's rank needs its
`rank_environment` (its GPU) before it imports anything, and CUDA cannot be forked once
initialised; the parent-death signal that ends the ranks with their server is Linux's.

One server per process and kind of rank (`shared_server`) serves every engine the process
builds: the replicas of `fastdeploy serve --data-parallel-size`, which fork their ranks from it
side by side, and an LLM built after another, whose ranks then start without waiting for any
import. `fastdeploy serve` starts it before importing its HTTP stack (`start_early`), so the two
imports overlap. It lives until the process exits (`close_shared_servers` at exit).

Supervision stays as for any child (`processes.py`): the server dies with the engine process
and each rank with the server (`worker.die_with_parent`). Each rank leads a process group of its
own, which the server kills when its engine asks (a failed rank's peers, a shutdown) without
touching other engines' ranks; the server reaps each rank and tells the engines how it ended.

Engine to server: `("fork", index, argv, env, log_path, model_path)` per rank, numbered in
order, and `("kill", index)`. Server to engine: `("forked", index, pid)` and `("exited", index,
returncode)` when a rank ends (by index: a long-lived server's pids are reused).
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from fastdeploy import envs
from fastdeploy.backends.base import Backend
from fastdeploy.backends.selection import select_backend_class
from fastdeploy.executor.processes import ChildProcess, describe_exit, start_child, stop_children
from fastdeploy.executor.protocol import PARENT_ENV
from fastdeploy.logger import get_logger
from fastdeploy.model_resolver import is_hub_id, resolve_model
from fastdeploy.plugins.registry import get_registry

#: the module the server runs (`python -m`)
SERVER_MODULE = "fastdeploy.executor.forkserver_process"


class ForkServer:
    """The engine's side: starts the server, asks it for ranks, learns how they end.

    Thread-safe: the replicas of a server share it and are built on threads of their own.
    """

    def __init__(
        self,
        backend: str,
        collectives: bool,
        env: dict[str, str],
        log_path: str,
        model_path: str | None = None,
    ) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            command = [
                sys.executable,
                "-m",
                SERVER_MODULE,
                "--fd",
                str(theirs.fileno()),
                "--backend",
                backend,
            ]
            command += (["--model", model_path] if model_path else []) + (
                ["--collectives"] if collectives else []
            )
            self.child = start_child("fork server", [], command, env, log_path, (theirs.fileno(),))
        self.log_path = log_path
        self._conn = Connection(ours.detach())
        self._lock = threading.RLock()
        self._pids: dict[int, int] = {}
        self._codes: dict[int, int] = {}
        self._requested = 0
        self.ended = False

    def fork(
        self,
        label: str,
        ranks: list[int],
        argv: list[str],
        env: dict[str, str],
        log_path: str,
        model_path: str | None = None,
    ) -> ChildProcess:
        """Ask for a rank running `python -m fastdeploy.executor.worker ARGV` with `env`, its
        output in `log_path` (the server forks it once its imports are done, and reads
        `model_path`'s configuration first if it has not yet)."""
        with self._lock:
            index = self._requested
            self._requested += 1
            self._send(("fork", index, argv, env, log_path, model_path))
        process = ForkedProcess(self, index)
        logs = {rank: log_path for rank in ranks}
        return ChildProcess(label, ranks, process, None, logs, process.describe)

    def kill(self, index: int) -> None:
        """Have the server SIGKILL the rank's process group (it reaps the rank and reports it)."""
        with self._lock:
            self._send(("kill", index))

    def _send(self, message: tuple) -> None:
        if self.ended:
            return
        try:
            self._conn.send(message)
        except OSError:  # the server has ended: its ranks died with it (ForkedProcess.describe)
            self._end()

    @property
    def alive(self) -> bool:
        """Whether the server still runs (it can fork more ranks)."""
        self.receive(0.0)
        return not self.ended and self.child.process.poll() is None

    @property
    def running_ranks(self) -> int:
        """Ranks forked or asked for that have not been reported as ended."""
        self.receive(0.0)
        return self._requested - len(self._codes)

    def pid(self, index: int) -> int | None:
        self.receive(0.0)
        return self._pids.get(index)

    def reported(self, index: int) -> bool:
        """Whether the server has said how the rank ended."""
        self.receive(0.0)
        return index in self._codes

    def returncode(self, index: int) -> int | None:
        """The rank's return code once the server has reaped it; where the server has ended
        without saying, the signal its ranks die of when it ends (SIGKILL, `die_with_parent`)."""
        if self.reported(index):
            return self._codes[index]
        return -signal.SIGKILL if self.ended else None

    def receive(self, timeout: float) -> None:
        """Take in what the server has said, waiting up to `timeout` seconds for its first word."""
        with self._lock:
            if self.ended:
                return
            try:
                while self._conn.poll(timeout):
                    message = self._conn.recv()
                    if message[0] == "forked":
                        self._pids[message[1]] = message[2]
                    else:
                        self._codes[message[1]] = message[2]
                    timeout = 0.0
            except (EOFError, OSError):
                self._end()

    def close(self, grace: float = 5.0) -> None:
        """End the server (it kills and reaps the ranks it still has) and wait for it, killing
        it after `grace` seconds."""
        with self._lock:
            self._end()
        stop_children([self.child], grace)

    def _end(self) -> None:
        self.ended = True
        self._conn.close()


class ForkedProcess:
    """A rank the fork server made, with `subprocess.Popen`'s `pid`, `poll`, `wait` and `kill`."""

    def __init__(self, server: ForkServer, index: int) -> None:
        self._server = server
        self._index = index

    @property
    def pid(self) -> int | None:
        return self._server.pid(self._index)

    def poll(self) -> int | None:
        return self._server.returncode(self._index)

    def kill(self) -> None:
        self._server.kill(self._index)

    def describe(self, code: int) -> str:
        """How the rank ended, in words (saying so when it ended with its server)."""
        if self._server.reported(self._index):
            return describe_exit(code)
        server = self._server.child.process.poll()
        ending = "is still running" if server is None else describe_exit(server)
        log = f"(its log: {self._server.log_path})"
        if self.pid is None:
            return f"did not start: its fork server {ending} {log}"
        return f"{describe_exit(code)} with its fork server, which {ending} {log}"

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            remaining = _WAIT_STEP if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(f"rank {self._index} of the fork server", timeout or 0.0)
            self._server.receive(min(remaining, _WAIT_STEP))
        if self._server.ended:
            _wait_gone(self.pid)
        return code


#: longest a waiting thread holds the server's connection (others ask it for pids meanwhile)
_WAIT_STEP = 0.05


def uses_fork_server(backend_class: type[Backend]) -> bool:
    """Whether ranks of `backend_class` on one host are forked by a fork server: a host backend
    (its ranks need no environment of their own) on Linux, unless `FD_DIST_FORK_SERVER=0`."""
    return (
        envs.dist_fork_server()
        and sys.platform.startswith("linux")
        and backend_class.device_count() is None
        and not backend_class.rank_environment(0)
    )


def server_environment(log_dir: str) -> dict[str, str]:
    """The environment a server starts with: this process's, its pid (the parent it must not
    outlive) and the log directory."""
    return dict(os.environ, **{PARENT_ENV: str(os.getpid()), "FD_LOG_DIR": log_dir})


# --- one server per process and kind of rank ----------------------------------------------------
_shared: dict[tuple, ForkServer] = {}
_shared_lock = threading.Lock()
#: servers started so far, each numbered for a log of its own
_started = itertools.count()


def shared_server(
    backend: str, collectives: bool, env: dict[str, str], log_dir: str, model_path: str | None
) -> ForkServer:
    """This process's running fork server for ranks of `backend` logging to `log_dir`, or a new
    one started with `env`.

    Every engine of the process shares it (the replicas of `fastdeploy serve
    --data-parallel-size`, LLMs built one after another), so only the first pays for its
    imports. A rank runs with the environment its engine gives it, but what was imported before
    the fork saw the server's: a variable read at import time (OpenBLAS's OMP_NUM_THREADS) keeps
    its value of the first parallel engine, as with multiprocessing's forkserver (the
    environment itself cannot be the key: imports such as threadpoolctl's add variables to it).
    A server of another log directory, or one that has ended, is replaced, and closed when it
    has no ranks left.
    """
    key = (backend, collectives, log_dir)
    with _shared_lock:
        server = _shared.get(key)
        if server is not None and server.alive:
            return server
        for other_key, other in list(_shared.items()):
            if other is server or other.running_ranks == 0:
                other.close()
                del _shared[other_key]
        number = next(_started)
        if number == 0:
            atexit.register(close_shared_servers)
        log = os.path.join(log_dir, f"forkserver.{number}.log")
        server = _shared[key] = ForkServer(backend, collectives, env, log, model_path)
        return server


def start_early(device: str | None, model: str | None, collectives: bool) -> ForkServer | None:
    """Start the shared server that ranks of `device`'s backend on this host will be forked by,
    before the caller imports what it needs next (the HTTP stack of `fastdeploy serve`), so the
    server's imports overlap the caller's; the engine built later finds it running. None where
    the ranks would not be forked; an error is left for the engine to report."""
    try:
        backend_class = select_backend_class(device or envs.device() or "auto", get_registry())
        if not uses_fork_server(backend_class):
            return None
        log_dir = os.path.abspath(envs.log_dir())
        os.makedirs(log_dir, exist_ok=True)
        # a hub model is downloaded by the engine, at the revision it was asked for
        model_path = None if is_hub_id(model) else resolve_model(model)
        return shared_server(
            backend_class.name, collectives, server_environment(log_dir), log_dir, model_path
        )
    except Exception:  # the engine meets the same error, and reports it where it should
        get_logger(__name__).debug("no fork server started early", exc_info=True)
        return None


def shared_servers() -> list[ForkServer]:
    """The shared servers this process has started and not closed."""
    with _shared_lock:
        return list(_shared.values())


def close_shared_servers() -> None:
    """Close every shared server (at exit: each is reaped rather than left to die of its
    parent-death signal)."""
    with _shared_lock:
        for server in _shared.values():
            server.close()
        _shared.clear()


def _wait_gone(pid: int | None, timeout: float = 5.0) -> None:
    """Wait until `pid` has exited (a rank whose server has ended dies of its parent-death signal)."""
    deadline = time.monotonic() + timeout
    while pid is not None and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.01)
