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

Supervision stays as for any child (`processes.py`): the server dies with the engine and each
rank with the server (`worker.die_with_parent`); the ranks stay in the server's process group,
which the engine kills whole; the server reaps each rank and tells the engine how it ended.

Engine to server: `(argv, env, log_path)` per rank. Server to engine: `("forked", pid)` in the
order of the requests, and `("exited", pid, returncode)` when a rank ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

from fastdeploy.distributed.processes import ChildProcess, describe_exit, start_child


class ForkServer:
    """The engine's side: starts the server, asks it for ranks, learns how they end."""

    def __init__(
        self, backend: str, collectives: bool, model_path: str, env: dict[str, str], log_path: str
    ) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            command = [sys.executable, "-m", __name__, "--fd", str(theirs.fileno()), "--backend", backend]
            command += ["--model", model_path] + (["--collectives"] if collectives else [])
            self.child = start_child("fork server", [], command, env, log_path, (theirs.fileno(),))
        self.log_path = log_path
        self._conn = Connection(ours.detach())
        self._pids: list[int] = []
        self._requested = 0
        self._codes: dict[int, int] = {}
        self.ended = False

    def fork(
        self, label: str, ranks: list[int], argv: list[str], env: dict[str, str], log_path: str
    ) -> ChildProcess:
        """Ask for a rank running `python -m fastdeploy.distributed.worker ARGV` with `env`, its
        output in `log_path` (the server forks it once its imports are done)."""
        try:
            self._conn.send((argv, env, log_path))
        except OSError:  # the server has ended: the rank reports it (ForkedProcess.describe)
            self.ended = True
        process = ForkedProcess(self, self._requested)
        self._requested += 1
        logs = {rank: log_path for rank in ranks}
        return ChildProcess(label, ranks, process, self.child.group, logs, process.describe)

    def pid(self, index: int) -> int | None:
        self.receive(0.0)
        return self._pids[index] if index < len(self._pids) else None

    def reported(self, index: int) -> bool:
        """Whether the server has said how the rank ended."""
        pid = self.pid(index)
        return pid is not None and pid in self._codes

    def returncode(self, index: int) -> int | None:
        """The rank's return code once the server has reaped it; where the server has ended
        without saying, the signal its ranks die of when it ends (SIGKILL, `die_with_parent`)."""
        if self.reported(index):
            return self._codes[self._pids[index]]
        return -signal.SIGKILL if self.ended else None

    def receive(self, timeout: float) -> None:
        """Take in what the server has said, waiting up to `timeout` seconds for its first word."""
        if self.ended:
            return
        try:
            while self._conn.poll(timeout):
                message = self._conn.recv()
                if message[0] == "forked":
                    self._pids.append(message[1])
                else:
                    self._codes[message[1]] = message[2]
                timeout = 0.0
        except (EOFError, OSError):
            self.ended = True
            self._conn.close()


class ForkedProcess:
    """A rank the fork server made, with `subprocess.Popen`'s `pid`, `poll` and `wait`."""

    def __init__(self, server: ForkServer, index: int) -> None:
        self._server = server
        self._index = index

    @property
    def pid(self) -> int | None:
        return self._server.pid(self._index)

    def poll(self) -> int | None:
        return self._server.returncode(self._index)

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
            remaining = 1.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(f"rank {self._index} of the fork server", timeout or 0.0)
            self._server.receive(min(remaining, 1.0))
        if self._server.ended:
            _wait_gone(self.pid)
        return code


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


# --- the server -------------------------------------------------------------------------------
def _serve(conn: Connection) -> None:
    """Fork a rank per request and report each one's end, until the engine closes the connection."""
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes the loop
    children: set[int] = set()
    while True:
        for ready in wait([conn, wake_read]):
            if ready is conn:
                try:
                    argv, env, log_path = conn.recv()
                except EOFError:  # the engine is done: nothing may outlive it
                    for pid in children:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    return
                pid = _fork(argv, env, log_path, [conn.fileno(), wake_read, wake_write])
                children.add(pid)
                conn.send(("forked", pid))
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_read, 512):
                        pass
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            conn.send(("exited", pid, os.waitstatus_to_exitcode(status)))


def _fork(argv: list[str], env: dict[str, str], log_path: str, inherited: list[int]) -> int:
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_rank(argv, env, log_path, inherited, parent)
    return pid


def _become_rank(
    argv: list[str], env: dict[str, str], log_path: str, inherited: list[int], parent: int
) -> NoReturn:
    """In the forked child: the rank's output, environment and parent, then the worker's main."""
    code: Any = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        from fastdeploy.distributed import worker

        os.environ.clear()
        os.environ.update(env)
        os.environ[worker.PARENT_ENV] = str(parent)
        code = worker.main(argv)
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    except BaseException:
        traceback.print_exc()
    finally:
        if isinstance(code, str):  # SystemExit("message"), as the interpreter would show it
            sys.stderr.write(code + "\n")
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--fd", type=int, required=True, help="descriptor of the connection to the engine")
    parser.add_argument("--backend", required=True, help="registered name of the ranks' backend")
    parser.add_argument("--collectives", action="store_true", help="import the backend's collectives runtime")
    parser.add_argument("--model", required=True, help="the checkpoint the ranks load")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    from fastdeploy.distributed import worker

    worker.die_with_parent()
    conn = Connection(args.fd)
    try:
        worker.preload(args.backend, args.collectives, args.model)
    except Exception:  # each rank meets the error again where it is reported to the engine
        traceback.print_exc()
    from fastdeploy.logger import get_logger

    get_logger(__name__).info(
        "fork server: ranks' code imported, checkpoint read, in %.2f s", time.perf_counter() - started
    )
    _serve(conn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
