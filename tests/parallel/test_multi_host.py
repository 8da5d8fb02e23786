"""Two "hosts" on the loopback interface, each a separate process group started the way a real
second machine would be: the same LLM(...) call with the same ips, FD_NODE_RANK telling the two
apart (both addresses are 127.0.0.1). Each host starts its ranks with paddle.distributed.launch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.parallel.rendezvous import free_port

pytest.importorskip("paddle", reason="multi-host ranks start with paddle.distributed.launch")


def test_tensor_parallel_over_two_hosts_matches_transformers(
    tiny_model_dirs, tiny_references, tmp_path, monkeypatch
):
    path = tiny_model_dirs["llama"]
    port = free_port()
    ips = "127.0.0.1,127.0.0.1"
    second_host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from fastdeploy import LLM\n"
            f"llm = LLM(model={path!r}, tensor_parallel_size=2, ips={ips!r}, engine_worker_queue_port={port})\n"
            "assert not llm._check_master()\n"
            "raise SystemExit(llm.follower_status)\n",
        ],
        env=dict(os.environ, FD_NODE_RANK="1", FD_LOG_DIR=str(tmp_path / "host1")),
        start_new_session=True,
    )
    try:
        monkeypatch.setenv("FD_NODE_RANK", "0")
        llm = LLM(
            model=path,
            tensor_parallel_size=2,
            ips=ips,
            engine_worker_queue_port=port,
            max_model_len=64,
            num_gpu_blocks_override=16,
            block_size=16,
        )
        assert llm._check_master()
        cases = tiny_references["llama"]["cases"]
        params = SamplingParams(temperature=0, max_tokens=len(cases[0]["output_token_ids"]), ignore_eos=True)
        outputs = llm.generate(
            [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases], params, use_tqdm=False
        )
        assert_tokens_match([o.outputs.token_ids for o in outputs], [c["output_token_ids"] for c in cases])
        llm.shutdown()
        # the master's shutdown ends the second host's ranks, and its LLM() returns
        assert second_host.wait(timeout=60) == 0
        # each host's launcher wrote its rank's log, as paddle.distributed.launch does
        assert (tmp_path / "host1" / "workerlog.0").exists()
    finally:
        if second_host.poll() is None:
            os.killpg(second_host.pid, 9)
            second_host.wait()
