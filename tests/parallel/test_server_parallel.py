"""The server with data-parallel replicas, and with a rank that dies: 503, non-zero exit, no orphans."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints" / "openai"))

from openai_server_helpers import ServerProcess, free_port, http_post, metric, wait_until  # noqa: E402

from fastdeploy import LLM, SamplingParams  # noqa: E402

pytest.importorskip("paddle", reason="rank processes of tensor parallelism use paddle.distributed (gloo)")

TINY_ARGS = [
    "--max-model-len",
    "64",
    "--block-size",
    "16",
    "--num-gpu-blocks-override",
    "16",
    "--max-num-seqs",
    "4",
]


def children_of(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def children_running(pid: int, module: bytes) -> list[int]:
    """Pids of `pid`'s children running `python -m MODULE`."""
    found = []
    for child in children_of(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module in command:
            found.append(child)
    return found


def fork_servers(server_pid: int) -> list[int]:
    return children_running(server_pid, b"fastdeploy.executor.forkserver_process")


def rank_processes(server_pid: int) -> list[int]:
    """Pids of the server's rank processes: its children running fastdeploy.executor.worker,
    or the children of its fork servers."""
    ranks = children_running(server_pid, b"fastdeploy.executor.worker")
    for server in fork_servers(server_pid):
        ranks.extend(children_of(server))
    return ranks


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def completion(server: ServerProcess, prompt: list[int], max_tokens: int) -> tuple[int, dict]:
    payload = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    return http_post(server.url + "/v1/completions", payload)


def test_two_replicas_behind_one_endpoint_answer_like_one_engine(tiny_model_dirs, tiny_references):
    path = tiny_model_dirs["llama"]
    cases = tiny_references["llama"]["cases"]
    reference = LLM(model=path, max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = [
        o.outputs.text
        for o in reference.generate(
            [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
        )
    ]
    server = ServerProcess(
        ["-m", "fastdeploy.entrypoints.openai.api_server", "--model", path, "--served-model-name", "tiny",
         "--data-parallel-size", "2", *TINY_ARGS],
        free_port(),
    )  # fmt: skip
    try:
        # each replica's model runs in a rank process of its own, forked by one fork server
        assert len(rank_processes(server.process.pid)) == 2
        assert len(fork_servers(server.process.pid)) == 1
        answers: dict[int, tuple[int, dict]] = {}
        threads = [
            threading.Thread(target=lambda i=i: answers.__setitem__(i, completion(server, cases[i % 2]["prompt_token_ids"], 8)))
            for i in range(4)
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for index, (status, body) in answers.items():
            assert status == 200, body
            assert body["choices"][0]["text"] == expected[index % 2]
    finally:
        assert server.stop() == 0


def test_each_rank_of_each_replica_logs_to_a_file_of_its_own(tiny_model_dirs, tmp_path):
    server = ServerProcess(
        ["-m", "fastdeploy.entrypoints.openai.api_server", "--model", tiny_model_dirs["llama"],
         "--served-model-name", "tiny", "--data-parallel-size", "2", "--tensor-parallel-size", "2",
         *TINY_ARGS],
        free_port(),
        {"FD_LOG_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        ranks = rank_processes(server.process.pid)
        assert len(ranks) == 4
        # the file each rank process writes its output to, as the kernel sees it
        log_of = {pid: Path(os.readlink(f"/proc/{pid}/fd/2")) for pid in ranks}
        assert sorted(log.name for log in log_of.values()) == [f"workerlog.{i}" for i in range(4)]
        # numbered across the replicas, as one launcher numbers a host's workers
        expected = {
            "workerlog.0": "rank 0",
            "workerlog.1": "rank 1",
            "workerlog.2": "rank 0 of replica 1",
            "workerlog.3": "rank 1 of replica 1",
        }
        for log in log_of.values():
            loaded = re.findall(r"\] (rank \d+(?: of replica \d+)?) loaded in ", log.read_text())
            assert loaded == [expected[log.name]], log
        # the error of a replica's rank names that replica and quotes that rank's file
        killed = next(pid for pid, log in log_of.items() if log.name == "workerlog.3")
        os.kill(killed, signal.SIGKILL)
        assert server.process.wait(timeout=30) == 1
        output = server.output()
        assert "error: the engine died: rank 1 of replica 1 was killed by signal SIGKILL" in output
        assert f"last lines of {tmp_path / 'workerlog.3'}:" in output
        wait_until(lambda: not any(alive(pid) for pid in ranks), 10, "the rank processes to be gone")
    finally:
        server.stop()


def tp2_server(path: str, env: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess(
        ["-m", "fastdeploy.entrypoints.openai.api_server", "--model", path, "--served-model-name", "tiny",
         "--tensor-parallel-size", "2", "--max-model-len", "256", "--block-size", "16",
         "--num-gpu-blocks-override", "16", "--max-num-seqs", "4"],
        free_port(),
        env,
    )  # fmt: skip


def test_a_rank_killed_mid_generation_makes_the_server_answer_503_and_exit_non_zero(
    tiny_model_dirs, tmp_path
):
    server = tp2_server(tiny_model_dirs["llama"], {"FD_LOG_DIR": str(tmp_path)})
    try:
        ranks = rank_processes(server.process.pid)
        assert len(ranks) == 2
        # one fork server, started before the HTTP stack and used by the engine (each has a log)
        assert len(fork_servers(server.process.pid)) == 1
        assert sorted(p.name for p in tmp_path.glob("forkserver.*")) == ["forkserver.0.log"]
        result: dict[str, tuple[int, dict]] = {}
        running = threading.Thread(target=lambda: result.__setitem__("r", completion(server, [1, 5, 9], 240)))
        running.start()
        wait_until(
            lambda: metric(server.metrics(), "fastdeploy:generation_tokens_total") > 0,
            60,
            "generation to start",
        )
        os.kill(ranks[1], signal.SIGKILL)
        killed = time.monotonic()
        running.join(timeout=30)
        status, body = result["r"]
        assert status == 503, body
        assert "rank 1 was killed by signal SIGKILL during generation" in body["error"]["message"]
        assert server.process.wait(timeout=30) == 1
        assert time.monotonic() - killed < 15
        assert "error: the engine died: rank 1 was killed by signal SIGKILL" in server.output()
        wait_until(lambda: not any(alive(pid) for pid in ranks), 10, "the rank processes to be gone")
    finally:
        server.stop()


def test_a_rank_that_dies_while_the_server_is_idle_stops_it_within_seconds(tiny_model_dirs):
    server = tp2_server(tiny_model_dirs["llama"])
    try:
        ranks = rank_processes(server.process.pid)
        os.kill(ranks[0], signal.SIGKILL)
        killed = time.monotonic()
        assert server.process.wait(timeout=30) == 1
        assert time.monotonic() - killed < 10
        assert "error: the engine died: rank 0 was killed by signal SIGKILL" in server.output()
        wait_until(lambda: not any(alive(pid) for pid in ranks), 10, "the rank processes to be gone")
    finally:
        server.stop()


EARLY_PROBE = """
import json, sys
from fastdeploy.executor import forkserver

def started(backend, collectives, env, log_dir, model_path):
    loaded = [name for name in ("uvicorn", "fastapi", "fastdeploy.entrypoints.openai.app") if name in sys.modules]
    print(json.dumps([backend, collectives, model_path, loaded]))
    raise SystemExit(0)

forkserver.shared_server = started
from fastdeploy.entrypoints.openai.api_server import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize(
    ("flags", "collectives"),
    [(["--tensor-parallel-size", "2"], True), (["--data-parallel-size", "2"], False)],
    ids=["tensor parallel", "data parallel"],
)
def test_the_fork_server_starts_before_the_http_stack_is_imported(tiny_model_dirs, flags, collectives):
    path = tiny_model_dirs["llama"]
    done = subprocess.run(
        [sys.executable, "-c", EARLY_PROBE, "--model", path, *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["cpu", collectives, path, []]
