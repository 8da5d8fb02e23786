"""Child processes the engine starts for its ranks: start, watch, describe their end, stop.

Each child is a fresh interpreter (`subprocess`, never `fork`: OpenMP and BLAS thread pools are
not fork-safe, and a fresh interpreter does not re-run the user's script the way
multiprocessing's spawn re-imports `__main__`). Children ask the kernel to kill them when the
engine process dies (`worker.die_with_parent`), and the engine kills them when one fails or when
it shuts down, so no rank outlives it.

Two details make that hold:
- The kernel's "parent died" signal fires when the *thread* that started the child exits. So
  every child is started by one long-lived thread of this process (`_Spawner`), whichever
  thread builds the engine (a server's replicas are built on worker threads, a notebook may
  build an LLM in a thread pool).
- Each child leads a process group of its own, and the engine kills the whole group: what a
  rank or a launcher forks (paddle's helpers) goes with it. Ctrl+C in a terminal reaches only
  the engine, which then stops its ranks in order.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

#: log lines of a failed rank quoted in the error
TAIL_LINES = 20


def tail(path: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a text file ('' if it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip("\n")
    except OSError:
        return ""


@dataclass
class ChildProcess:
    """One process the engine started: a rank, or a launcher that starts several."""

    label: str
    ranks: list[int]
    popen: subprocess.Popen
    #: log file of each of its ranks
    logs: dict[int, str] = field(default_factory=dict)
    #: a descriptor readable once the process has exited (Linux pidfd), for `connection.wait`
    sentinel: int | None = None

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def how_it_ended(self) -> str:
        code = self.popen.poll()
        if code is None:
            return "is still running"
        if code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def close(self) -> None:
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None


class _Spawner:
    """One daemon thread that starts every child process (see the module docstring)."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Callable[[], subprocess.Popen], Future]] = queue.Queue()
        threading.Thread(target=self._serve, name="fastdeploy-spawner", daemon=True).start()

    def _serve(self) -> None:
        while True:
            start, future = self._requests.get()
            try:
                future.set_result(start())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def run(self, start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        future: Future = Future()
        self._requests.put((start, future))
        return future.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawn(start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
    return _spawner.run(start)


def start_child(
    label: str, ranks: list[int], command: list[str], env: dict[str, str], log_path: str | None
) -> ChildProcess:
    """Start `command` with `env` in a process group of its own, its output written to `log_path`
    (or inherited), from the spawner thread."""
    output = open(log_path, "w", encoding="utf-8") if log_path else None  # noqa: SIM115 - the child keeps it
    try:
        popen = _spawn(
            lambda: subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                start_new_session=True,
            )
        )
    finally:
        if output is not None:
            output.close()
    sentinel = None
    if hasattr(os, "pidfd_open"):
        try:
            sentinel = os.pidfd_open(popen.pid)
        except OSError:
            sentinel = None
    logs = {rank: log_path for rank in ranks} if log_path else {}
    return ChildProcess(label, ranks, popen, logs, sentinel)


def stop_children(children: list[ChildProcess], grace: float) -> None:
    """Wait up to `grace` seconds for the children to exit by themselves, then SIGKILL the rest."""
    deadline = time.monotonic() + grace
    for child in children:
        remaining = deadline - time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(timeout=max(remaining, 0.0))
    kill_children(children)


def kill_children(children: list[ChildProcess]) -> None:
    """SIGKILL every child's process group and reap the child (a rank stuck in a collective
    ignores SIGTERM; what it forked goes too)."""
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.popen.pid, signal.SIGKILL)
    for child in children:
        child.popen.wait()
        child.close()
