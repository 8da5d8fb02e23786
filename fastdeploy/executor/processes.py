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

Ranks of a host backend are forked by a fork server instead (`forkserver.py`), itself a fresh
interpreter started here and shared by the engines of this process; they are children of the
fork server, each in a process group of its own, which the server kills when asked and reports
how they end.
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
from typing import Protocol

#: log lines of a failed rank quoted in the error
TAIL_LINES = 20


def tail(path: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a text file ('' if it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip("\n")
    except OSError:
        return ""


class Process(Protocol):
    """A started process as `subprocess.Popen` presents it (`forkserver.ForkedProcess` does too)."""

    @property
    def pid(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


def describe_exit(code: int) -> str:
    """How a process with this return code ended, in words."""
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class ChildProcess:
    """One process the engine started: a rank, or a launcher that starts several."""

    label: str
    ranks: list[int]
    process: Process
    #: the process group killed with it (its own); None: `process.kill()` kills it and its group
    #: (a forked rank, which its fork server kills)
    group: int | None
    #: log file of each of its ranks
    logs: dict[int, str] = field(default_factory=dict)
    #: its return code in words
    describe: Callable[[int], str] = describe_exit
    _pidfd: int | None = None
    _pidfd_tried: bool = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def sentinel(self) -> int | None:
        """A descriptor readable once the process has exited (Linux pidfd), for `connection.wait`;
        None where there are none, or while a fork server has not said the pid yet."""
        self.open_sentinel()
        return self._pidfd

    def open_sentinel(self) -> None:
        """Open the pidfd once the pid is known (no-op after the first try)."""
        if self._pidfd_tried or not hasattr(os, "pidfd_open"):
            return
        pid = self.pid
        if pid is not None:
            self._pidfd_tried = True
            with contextlib.suppress(OSError):
                self._pidfd = os.pidfd_open(pid)

    def exited(self) -> bool:
        return self.process.poll() is not None

    def how_it_ended(self) -> str:
        code = self.process.poll()
        return "is still running" if code is None else self.describe(code)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


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
    label: str,
    ranks: list[int],
    command: list[str],
    env: dict[str, str],
    log_path: str | None,
    pass_fds: tuple[int, ...] = (),
) -> ChildProcess:
    """Start `command` with `env` in a process group of its own, its output written to `log_path`
    (or inherited), from the spawner thread; `pass_fds` stay open in it."""
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
                pass_fds=pass_fds,
            )
        )
    finally:
        if output is not None:
            output.close()
    child = ChildProcess(
        label, ranks, popen, popen.pid, {rank: log_path for rank in ranks} if log_path else {}
    )
    child.open_sentinel()  # now, while the child cannot have been reaped
    return child


def stop_children(children: list[ChildProcess], grace: float) -> None:
    """Wait up to `grace` seconds for the children to exit by themselves, then SIGKILL the rest."""
    deadline = time.monotonic() + grace
    for child in children:
        remaining = deadline - time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.process.wait(timeout=max(remaining, 0.0))
    kill_children(children)


def kill_children(children: list[ChildProcess]) -> None:
    """SIGKILL every child's process group and wait until each child is gone (a rank stuck in a
    collective ignores SIGTERM; what it forked goes too)."""
    for group in {child.group for child in children if child.group is not None}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for child in children:
        if child.group is None:
            child.process.kill()
    for child in children:
        child.process.wait()
        child.close()
