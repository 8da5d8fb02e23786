"""The fork server process (`python -m fastdeploy.executor.forkserver_process`): imports
what a rank runs once, then forks a rank per request of its engines, kills one when asked,
and reports how each ended. Why, and the engine's side: `forkserver.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn


def _serve(conn: Connection, backend: str, collectives: bool) -> None:
    """Fork a rank per request, kill one when asked, report each one's end, until the engine
    closes the connection."""
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes the loop
    children: dict[int, int] = {}  # pid -> request index
    pids: dict[int, int] = {}  # request index -> pid, while the rank runs
    while True:
        for source in wait([conn, wake_read]):
            if source is conn:
                try:
                    request = conn.recv()
                except EOFError:  # the engine is done: nothing may outlive it
                    for pid in children:
                        _kill_group(pid)
                    for pid in children:
                        os.waitpid(pid, 0)
                    return
                if request[0] == "kill":
                    if request[1] in pids:
                        _kill_group(pids[request[1]])
                    continue
                _, index, argv, env, log_path, model_path = request
                if model_path:
                    _read_checkpoint(backend, collectives, model_path)
                pid = _fork(argv, env, log_path, [conn.fileno(), wake_read, wake_write])
                children[pid], pids[index] = index, pid
                conn.send(("forked", index, pid))
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_read, 512):
                        pass
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            index = children.pop(pid)
            del pids[index]
            conn.send(("exited", index, os.waitstatus_to_exitcode(status)))


def _kill_group(pid: int) -> None:
    """SIGKILL a rank and what it started (it leads its own process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


_read: set[str] = set()


def _read_checkpoint(backend: str, collectives: bool, model_path: str) -> None:
    """Read a checkpoint's configuration once, before forking its first rank (see `worker.preload`)."""
    if model_path in _read:
        return
    _read.add(model_path)
    from fastdeploy.executor import worker

    try:
        worker.preload(backend, collectives, model_path)
    except Exception:  # each rank meets the error again where it is reported to the engine
        traceback.print_exc()


def _fork(argv: list[str], env: dict[str, str], log_path: str, inherited: list[int]) -> int:
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_rank(argv, env, log_path, inherited, parent)
    # both sides set the group, as shells do: the pid is reported (and may be killed as a group)
    # before the child has run a line, and the group must exist by then
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpgid(pid, pid)
    return pid


def _become_rank(
    argv: list[str], env: dict[str, str], log_path: str, inherited: list[int], parent: int
) -> NoReturn:
    """In the forked child: the rank's output, environment and parent, then the worker's main."""
    code: Any = 1
    try:
        os.setpgid(0, 0)  # a process group of its own, killed whole (`_kill_group`)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        from fastdeploy.executor import worker

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
    parser = argparse.ArgumentParser(prog="python -m fastdeploy.executor.forkserver_process")
    parser.add_argument("--fd", type=int, required=True, help="descriptor of the connection to the engine")
    parser.add_argument("--backend", required=True, help="registered name of the ranks' backend")
    parser.add_argument("--collectives", action="store_true", help="import the backend's collectives runtime")
    parser.add_argument("--model", help="a checkpoint whose configuration to read before the first rank")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    from fastdeploy.executor import worker

    worker.die_with_parent()
    conn = Connection(args.fd)
    try:
        worker.preload(args.backend, args.collectives)
    except Exception:  # each rank meets the error again where it is reported to the engine
        traceback.print_exc()
    if args.model:
        _read_checkpoint(args.backend, args.collectives, args.model)
    from fastdeploy.logger import get_logger

    get_logger("fastdeploy.executor.forkserver_process").info(
        "fork server: ranks' code imported in %.2f s", time.perf_counter() - started
    )
    _serve(conn, args.backend, args.collectives)
    return 0


if __name__ == "__main__":
    sys.exit(main())
