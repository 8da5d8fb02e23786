"""Rank processes that fail or die: LLM() / generate raise within seconds, naming the rank and
quoting its log, and no rank process is left behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny_checkpoints as tiny

from fastdeploy import LLM, SamplingParams
from fastdeploy.errors import WorkerFailedError

pytest.importorskip("paddle", reason="tensor parallelism on the CPU uses paddle.distributed (gloo)")


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (zombies count as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def tiny_llama_tp2(tiny_model_dirs) -> LLM:
    return LLM(
        model=tiny_model_dirs["llama"],
        tensor_parallel_size=2,
        max_model_len=64,
        num_gpu_blocks_override=16,
        block_size=16,
    )


def rank_pids(llm: LLM) -> list[int]:
    return [child.pid for child in llm.llm_engine.executor._children.processes]


@pytest.mark.parametrize("fork_server", ["1", "0"], ids=["forked ranks", "fresh interpreters"])
def test_a_rank_killed_mid_generation_fails_the_call_and_leaves_no_process(
    tiny_model_dirs, monkeypatch, fork_server
):
    monkeypatch.setenv("FD_DIST_FORK_SERVER", fork_server)
    llm = tiny_llama_tp2(tiny_model_dirs)
    pids = rank_pids(llm)
    executor = llm.llm_engine.executor
    assert len(executor._children.servers) == int(fork_server)
    steps = []
    submit = executor.submit

    def kill_rank_1_at_step_3(batch):
        steps.append(batch)
        if len(steps) == 3:
            os.kill(pids[1], signal.SIGKILL)
        submit(batch)

    monkeypatch.setattr(executor, "submit", kill_rank_1_at_step_3)
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as error:
        llm.generate(
            {"prompt_token_ids": [1, 5, 9]}, SamplingParams(max_tokens=40, ignore_eos=True), use_tqdm=False
        )
    assert time.monotonic() - started < 10
    message = str(error.value)
    assert message.startswith("rank 1 was killed by signal SIGKILL during generation")
    assert "last lines of" in message and "workerlog.1" in message
    assert not any(alive(pid) for pid in pids)
    # the engine stays failed: later calls raise the same error instead of hanging
    with pytest.raises(WorkerFailedError, match="rank 1 was killed"):
        llm.generate({"prompt_token_ids": [1, 5]}, SamplingParams(max_tokens=2), use_tqdm=False)


def test_ranks_die_with_their_fork_server_and_the_next_call_says_so(tiny_model_dirs):
    llm = tiny_llama_tp2(tiny_model_dirs)
    (server,) = llm.llm_engine.executor._children.servers
    pids = rank_pids(llm)
    os.kill(server.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as error:
        llm.generate({"prompt_token_ids": [1, 5, 9]}, SamplingParams(max_tokens=4), use_tqdm=False)
    assert time.monotonic() - started < 10
    assert (
        "was killed by signal SIGKILL with its fork server, which was killed by signal SIGKILL (its log: "
        in str(error.value)
    )
    assert not any(alive(pid) for pid in [*pids, server.pid])


def test_a_rank_that_fails_to_load_makes_llm_raise_with_its_error(tmp_path):
    tensors = tiny.write_checkpoint(tmp_path, "llama")
    tiny.write_ernie_tokenizer(tmp_path)
    # the driver reads only config.json; the ranks find a tensor missing
    del tensors["model.layers.1.mlp.down_proj.weight"]
    tiny.write_safetensors(tmp_path, tensors)
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as error:
        LLM(model=str(tmp_path), tensor_parallel_size=2, max_model_len=64, num_gpu_blocks_override=16)
    assert time.monotonic() - started < 60
    message = str(error.value)
    assert "while loading the model" in message
    assert message.startswith(("rank 0 raised an error", "rank 1 raised an error"))
    assert (
        "WeightLoadError: checkpoint does not match the model: missing tensors: model.layers.1.mlp.down_proj.weight"
        in message
    )
    assert "last lines of" in message


def test_a_host_that_never_starts_fails_with_the_address_and_time_out(tiny_model_dirs, monkeypatch):
    """Two hosts on the loopback, the second never started: the first gives up after the time-out."""
    monkeypatch.setenv("FD_NODE_RANK", "0")
    monkeypatch.setenv("FD_DIST_INIT_TIMEOUT", "3")
    with socket.socket() as probe:  # a port nothing else holds (another suite may run beside)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as error:
        LLM(
            model=tiny_model_dirs["llama"],
            tensor_parallel_size=2,
            ips="127.0.0.1,127.0.0.1",
            engine_worker_queue_port=port,
        )
    assert time.monotonic() - started < 30
    message = str(error.value)
    assert f"did not connect to the engine at 127.0.0.1:{port} within 3 s" in message
    assert "start fastdeploy with the same ips there" in message


ENGINE_SCRIPT = """
import sys, threading, time
from fastdeploy import LLM, SamplingParams
built = {}
# built on a thread that then exits: its ranks must not die with that thread
thread = threading.Thread(target=lambda: built.setdefault("llm", LLM(model=sys.argv[1], tensor_parallel_size=2,
                          max_model_len=64, num_gpu_blocks_override=16, block_size=16)))
thread.start()
thread.join()
llm = built["llm"]
output = llm.generate({"prompt_token_ids": [1, 5, 9]}, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)[0]
assert len(output.outputs.token_ids) == 3, output.error_msg
children = llm.llm_engine.executor._children
pids = [child.pid for child in children.processes + children.servers]
print("ranks", *pids, flush=True)
time.sleep(600)
"""


def test_ranks_die_with_an_engine_that_is_killed(tiny_model_dirs):
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE_SCRIPT, tiny_model_dirs["llama"]], stdout=subprocess.PIPE, text=True
    )
    try:
        line = engine.stdout.readline()
        assert line.startswith("ranks "), line
        pids = [int(pid) for pid in line.split()[1:]]  # the two ranks and their fork server
        assert len(pids) == 3 and all(alive(pid) for pid in pids)
        engine.kill()
        engine.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in pids)
    finally:
        engine.kill()
        engine.wait()


def test_a_fork_server_that_fails_to_start_makes_llm_raise_naming_the_rank(
    tiny_model_dirs, monkeypatch, tmp_path
):
    # a sitecustomize on the server's path ends every new interpreter at once, with code 3
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import os\nos._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("FD_LOG_DIR", str(tmp_path / "log"))  # a fork server of its own
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as error:
        tiny_llama_tp2(tiny_model_dirs)
    assert time.monotonic() - started < 10
    assert str(error.value).startswith(
        "rank 0 did not start: its fork server exited with code 3 "
        f"(its log: {tmp_path / 'log' / 'forkserver.'}"
    )


def test_engines_sharing_a_fork_server_fail_alone(tiny_model_dirs):
    """A rank of one engine dies: that engine raises and its ranks go; the other engine, whose
    ranks the same fork server forked, keeps generating."""
    first, second = tiny_llama_tp2(tiny_model_dirs), tiny_llama_tp2(tiny_model_dirs)
    try:
        (server,) = first.llm_engine.executor._children.servers
        assert second.llm_engine.executor._children.servers == [server]
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        expected = second.generate({"prompt_token_ids": [1, 5, 9]}, params, use_tqdm=False)[
            0
        ].outputs.token_ids
        doomed = rank_pids(first)
        os.kill(doomed[0], signal.SIGKILL)
        with pytest.raises(WorkerFailedError, match="rank 0 was killed by signal SIGKILL"):
            first.generate({"prompt_token_ids": [1, 5, 9]}, params, use_tqdm=False)
        assert not any(alive(pid) for pid in doomed)
        assert all(alive(pid) for pid in [*rank_pids(second), server.pid])
        again = second.generate({"prompt_token_ids": [1, 5, 9]}, params, use_tqdm=False)[0].outputs.token_ids
        assert again == expected
    finally:
        second.shutdown()
