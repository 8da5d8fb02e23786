"""Child processes the engine starts for its ranks: start, watch, describe their end, stop.

Each child is a fresh interpreter (`subprocess`, never `fork`: OpenMP and BLAS thread pools are
not fork-safe, and a fresh interpreter does not re-run the user's script the way
multiprocessing's spawn re-imports `__main__`). Children ask the kernel to kill them when the
engine process dies (`worker.die_with_parent`), and the engine kills them when one fails or when
it shuts down, so no rank outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import deque
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


def start_child(
    label: str, ranks: list[int], command: list[str], env: dict[str, str], log_path: str | None
) -> ChildProcess:
    """Start `command` with `env`, its output appended to `log_path` (or inherited)."""
    output = open(log_path, "w", encoding="utf-8") if log_path else None  # noqa: SIM115 - the child keeps it
    try:
        popen = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
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
    """SIGKILL every child still running and reap it (a rank stuck in a collective ignores SIGTERM)."""
    for child in children:
        if child.popen.poll() is None:
            child.popen.kill()
    for child in children:
        child.popen.wait()
        child.close()
