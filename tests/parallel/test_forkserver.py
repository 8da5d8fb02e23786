"""The fork server on its own: it forks ranks that run the worker's main, reports how they end,
and a rank asked of a server that has ended says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import tiny_checkpoints as tiny

from fastdeploy.executor.forkserver import ForkServer, shared_server, shared_servers
from fastdeploy.executor.processes import kill_children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks are forked on Linux")

#: a worker that cannot reach its engine: it exits with code 1 and says why
UNREACHABLE = ["--driver", "127.0.0.1:1", "--timeout", "0"]
RANK_ENV = dict(os.environ, FD_DIST_AUTHKEY="00" * 16)


@pytest.fixture
def server(tmp_path):
    tiny.write_checkpoint(tmp_path, "llama")
    server = ForkServer("cpu", False, dict(os.environ), str(tmp_path / "forkserver.log"), str(tmp_path))
    yield server
    server.close()


def test_a_forked_rank_runs_the_worker_and_its_exit_code_comes_back(server, tmp_path):
    log = tmp_path / "workerlog.0"
    child = server.fork("rank 0", [0], UNREACHABLE, RANK_ENV, str(log))
    assert child.process.wait(timeout=120) == 1
    assert child.how_it_ended() == "exited with code 1"
    assert child.pid not in (None, os.getpid(), server.child.pid)
    assert "cannot reach the engine at 127.0.0.1:1" in log.read_text()
    assert child.group is None  # the server kills it (its own process group)


def test_a_rank_asked_of_a_server_that_has_ended_did_not_start(server, tmp_path):
    os.kill(server.child.pid, signal.SIGKILL)
    server.child.process.wait()
    child = server.fork("rank 0", [0], UNREACHABLE, RANK_ENV, str(tmp_path / "workerlog.0"))
    assert child.process.wait(timeout=10) == -signal.SIGKILL
    assert child.how_it_ended() == (
        f"did not start: its fork server was killed by signal SIGKILL (its log: {tmp_path / 'forkserver.log'})"
    )


def test_the_server_runs_this_interpreter(server):
    # its executable, not its cmdline: the kernel sets the arguments a moment after the exec
    # that Popen waits for, so the cmdline can still read empty
    assert os.readlink(f"/proc/{server.child.pid}/exe") == os.path.realpath(sys.executable)


def test_a_rank_killed_on_request_is_reported_and_the_server_forks_on(server, tmp_path):
    waiting = ["--driver", "127.0.0.1:1", "--timeout", "60"]  # retries the engine for a minute
    child = server.fork("rank 0", [0], waiting, RANK_ENV, str(tmp_path / "workerlog.0"))
    wait_for_pid(child)
    assert os.getpgid(child.pid) == child.pid  # a process group of its own
    kill_children([child])
    assert child.how_it_ended() == "was killed by signal SIGKILL"
    assert server.alive
    other = server.fork("rank 1", [1], UNREACHABLE, RANK_ENV, str(tmp_path / "workerlog.1"))
    assert other.process.wait(timeout=60) == 1


def wait_for_pid(child) -> None:
    deadline = time.monotonic() + 120
    while child.pid is None:
        assert time.monotonic() < deadline, "the server did not fork the rank"
        time.sleep(0.05)


def test_engines_of_a_process_share_one_server_until_it_ends(tmp_path):
    env = dict(os.environ)
    first = shared_server("cpu", False, env, str(tmp_path), None)
    try:
        assert shared_server("cpu", False, env, str(tmp_path), None) is first
        os.kill(first.child.pid, signal.SIGKILL)
        first.child.process.wait()
        second = shared_server("cpu", False, env, str(tmp_path), None)
        assert second is not first and second.alive
        assert sorted(p.name for p in tmp_path.glob("forkserver.*")) == [
            os.path.basename(first.log_path),
            os.path.basename(second.log_path),
        ]
    finally:
        for started in shared_servers():
            if started.log_path.startswith(str(tmp_path)):
                started.close()
    assert not second.alive


def test_what_a_gguf_rank_loads_with_is_imported_before_the_fork():
    probe = (
        "import sys\n"
        "from fastdeploy.executor import worker\n"
        "from fastdeploy.model_resolver import embedded_model_path\n"
        "worker.preload('cpu', False, embedded_model_path())\n"
        "print('gguf.quants' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
