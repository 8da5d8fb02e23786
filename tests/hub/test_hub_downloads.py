"""Model ids from a Hugging Face Hub: `LLM(model="org/name")`, the CLI, `org/name:QUANT`, and
each failure as one line naming the id and what to do.

Everything runs against `fake_hub.FakeHub` on loopback (HF_ENDPOINT), with a fresh cache per
test (HF_HUB_CACHE): no test reaches the internet. The reference for a downloaded model is the
same files loaded by path.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from fake_hub import FakeHub, Repo
from huggingface_hub import constants as hf_constants
from safetensors.numpy import save_file
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.cli import main
from fastdeploy.errors import FastDeployError, InvalidArgumentError, ModelDownloadError, ModelNotFoundError
from fastdeploy.model_resolver import resolve_model

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gguf")
#: a GGUF with a byte-level BPE vocabulary (GGUF tokenizers are read for those only)
F32_FIXTURE = os.path.join(FIXTURES, "tiny-qwen3-moe-f32.gguf")
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
#: files of org/tiny the model does not need: none may be downloaded
UNNEEDED = {
    "pytorch_model.bin": b"\0" * 64,
    "original/consolidated.pth": b"\0" * 64,
    "onnx/model.onnx": b"\0" * 64,
    "README.md": b"# tiny\n",
    "tiny-Q8_0.gguf": b"GGUF not wanted",
}
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPT = "The hub serves"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A tiny random Llama as a sharded safetensors checkpoint (index + 2 shards) with its tokenizer."""
    directory = str(tmp_path_factory.mktemp("tiny"))
    config, weights = tiny_llama(directory)
    os.remove(os.path.join(directory, "model.safetensors"))
    names = sorted(weights)
    weight_map = {}
    for index, shard in enumerate(SHARDS):
        part = {name: np.ascontiguousarray(weights[name]) for name in names[index :: len(SHARDS)]}
        save_file(part, os.path.join(directory, shard))
        weight_map.update(dict.fromkeys(part, shard))
    with open(os.path.join(directory, "model.safetensors.index.json"), "w", encoding="utf-8") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    with open(os.path.join(directory, "generation_config.json"), "w", encoding="utf-8") as handle:
        json.dump({"eos_token_id": config["eos_token_id"]}, handle)
    return directory


def read_dir(directory: str) -> dict[str, bytes]:
    files = {}
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as handle:
            files[name] = handle.read()
    return files


def gguf_repo() -> dict[str, bytes]:
    """Several GGUFs of one model, a split one and a vision projector; only the F32 file is a real
    model (the others are only picked, never loaded)."""
    with open(F32_FIXTURE, "rb") as handle:
        f32 = handle.read()
    return {
        "Tiny-MoE-F32.gguf": f32,
        "Tiny-MoE-Q8_0.gguf": b"GGUF q8_0",
        "Tiny-MoE-Q4_K_M.gguf": b"GGUF q4_k_m",
        "Tiny-MoE-Q4_K_S.gguf": b"GGUF q4_k_s",
        "Q5_K_M/Tiny-MoE-Q5_K_M-00001-of-00002.gguf": b"GGUF shard 1",
        "Q5_K_M/Tiny-MoE-Q5_K_M-00002-of-00002.gguf": b"GGUF shard 2",
        "mmproj-Tiny-MoE-Q8_0.gguf": b"GGUF projector",
        "README.md": b"# GGUFs\n",
    }


@pytest.fixture(scope="module")
def hub(checkpoint):
    tiny = Repo({**read_dir(checkpoint), **UNNEEDED})
    tiny.revisions["v1"] = tiny.commit
    repos = {
        "org/tiny": tiny,
        "org/gated": Repo(read_dir(checkpoint), gated=True),
        "org/bin-only": Repo({"config.json": b"{}", "pytorch_model.bin": b"\0" * 64, "README.md": b"#"}),
        "org/tiny-gguf": Repo(gguf_repo()),
    }
    with FakeHub(repos) as server:
        yield server


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    """HF_ENDPOINT on the fake hub, an empty cache, no token, online, Hugging Face as the source."""
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "FD_MODEL_SOURCE",
    ):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: a suite run under HF_HUB_OFFLINE=1 must
    # not leave it refusing the loopback hub
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    hub.requests.clear()
    return hub


def greedy_tokens(model: str, **options) -> list[int]:
    llm = LLM(model=model, max_model_len=64, num_gpu_blocks_override=4, **options)
    try:
        return list(llm.generate([PROMPT], GREEDY)[0].outputs.token_ids)
    finally:
        llm.shutdown()


def one_line_error(kind: type[FastDeployError], action) -> str:
    with pytest.raises(kind) as error:
        action()
    message = str(error.value)
    assert "\n" not in message
    return message


def test_llm_from_a_hub_id_generates_what_the_same_files_give_by_path(env, checkpoint):
    by_path = greedy_tokens(checkpoint)
    assert len(by_path) == 24
    assert_tokens_match([greedy_tokens("org/tiny")], [by_path])
    expected = set(read_dir(checkpoint))
    assert env.downloaded() == expected, "only the files the model needs are downloaded"
    assert not expected & set(UNNEEDED)


def test_a_connection_cut_mid_file_resumes_from_the_bytes_received(env, checkpoint, monkeypatch):
    # the shard then spans many of the client's write chunks, as a real multi-GB file spans its 10 MB ones
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 8192)
    env.drop_once.add(SHARDS[0])
    path = resolve_model("org/tiny")
    size = os.path.getsize(os.path.join(checkpoint, SHARDS[0]))
    first, resumed = [r.range for r in env.cdn_gets() if r.path.endswith(SHARDS[0])]
    assert first is None and resumed.startswith("bytes=") and resumed.endswith("-")
    assert 0 < int(resumed[len("bytes=") : -1]) <= size // 2  # from what arrived, not from 0
    assert read_dir(path)[SHARDS[0]] == read_dir(checkpoint)[SHARDS[0]]


def test_a_failed_download_keeps_the_finished_files_for_the_next_run(env, checkpoint):
    env.fail_once.add(SHARDS[1])
    message = one_line_error(ModelDownloadError, lambda: resolve_model("org/tiny"))
    assert "org/tiny" in message and "HTTP 500" in message and "run again" in message
    env.requests.clear()
    path = resolve_model("org/tiny")
    assert [r.path.rsplit("/", 1)[1] for r in env.cdn_gets()] == [SHARDS[1]]
    assert read_dir(path) == read_dir(checkpoint)


def test_revision_picks_a_branch_or_commit_and_a_bad_one_is_named(env, checkpoint):
    commit = env.repos["org/tiny"].commit
    by_branch = resolve_model("org/tiny", revision="v1")
    assert os.path.basename(by_branch) == commit
    assert resolve_model("org/tiny", revision=commit) == by_branch
    message = one_line_error(ModelNotFoundError, lambda: resolve_model("org/tiny", revision="v9"))
    assert "org/tiny" in message and "'v9'" in message and "revision=" in message


def test_a_gated_repository_needs_hf_token(env, monkeypatch, checkpoint):
    message = one_line_error(ModelDownloadError, lambda: resolve_model("org/gated"))
    assert "org/gated" in message and "gated" in message and "HF_TOKEN" in message
    monkeypatch.setenv("HF_TOKEN", env.token)
    env.requests.clear()
    assert read_dir(resolve_model("org/gated")) == read_dir(checkpoint)
    assert {r.authorization for r in env.requests if "/resolve/" in r.path} == {f"Bearer {env.token}"}


def test_an_unknown_repository_is_a_404_naming_it(env):
    message = one_line_error(ModelNotFoundError, lambda: resolve_model("org/missing"))
    assert "'org/missing'" in message and "404" in message and env.endpoint in message


def test_a_repository_without_weights_is_refused_before_downloading(env):
    message = one_line_error(ModelNotFoundError, lambda: resolve_model("org/bin-only"))
    assert "org/bin-only" in message and "no weights" in message and "pytorch_model.bin" in message
    assert env.downloaded() == set()


def test_offline_uses_the_cache_without_a_request(env, monkeypatch, checkpoint):
    online = resolve_model("org/tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env.requests.clear()
    assert resolve_model("org/tiny") == online
    assert_tokens_match([greedy_tokens("org/tiny")], [greedy_tokens(checkpoint)])
    assert env.requests == []


def test_offline_and_not_cached_says_so(env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = one_line_error(ModelNotFoundError, lambda: resolve_model("org/tiny"))
    assert (
        "org/tiny" in message and "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE" in message
    )
    assert env.requests == []


def test_an_unreachable_hub_falls_back_to_the_cache(env, monkeypatch, tmp_path):
    online = resolve_model("org/tiny")
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert resolve_model("org/tiny") == online
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    message = one_line_error(ModelNotFoundError, lambda: resolve_model("org/tiny"))
    assert "org/tiny" in message and "cannot be reached" in message


def test_a_full_disk_is_one_line_naming_the_id(env, monkeypatch):
    import huggingface_hub.file_download as file_download

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_download, "http_get", no_space)
    message = one_line_error(ModelDownloadError, lambda: resolve_model("org/tiny"))
    assert "no space left" in message and "org/tiny" in message and "HF_HOME" in message


def test_a_quant_tag_picks_one_gguf_and_downloads_only_it(env):
    by_path = greedy_tokens(F32_FIXTURE)
    assert_tokens_match([greedy_tokens("org/tiny-gguf:f32")], [by_path])
    assert env.downloaded() == {"Tiny-MoE-F32.gguf"}


def test_quant_tags_gguf_file_and_the_default_pick_like_llama_cpp(env):
    snapshot = f"/snapshots/{env.repos['org/tiny-gguf'].commit}/"

    def picked(model: str, **kwargs) -> str:
        return resolve_model(model, **kwargs).split(snapshot, 1)[1]

    assert picked("org/tiny-gguf:Q4_K_M") == "Tiny-MoE-Q4_K_M.gguf"
    assert picked("org/tiny-gguf:q4_k_s") == "Tiny-MoE-Q4_K_S.gguf"
    assert picked("org/tiny-gguf") == "Tiny-MoE-Q4_K_M.gguf"  # llama.cpp's default tag
    assert picked("org/tiny-gguf", gguf_file="Tiny-MoE-Q8_0.gguf") == "Tiny-MoE-Q8_0.gguf"
    assert picked("org/tiny-gguf:Q5_K_M") == "Q5_K_M/Tiny-MoE-Q5_K_M-00001-of-00002.gguf"
    assert "Q5_K_M/Tiny-MoE-Q5_K_M-00002-of-00002.gguf" in env.downloaded()
    assert "mmproj-Tiny-MoE-Q8_0.gguf" not in env.downloaded()
    message = one_line_error(ModelNotFoundError, lambda: resolve_model("org/tiny-gguf:IQ2_XXS"))
    assert "'IQ2_XXS'" in message and "Tiny-MoE-Q8_0.gguf" in message
    message = one_line_error(
        ModelNotFoundError, lambda: resolve_model("org/tiny-gguf", gguf_file="nope.gguf")
    )
    assert "'nope.gguf'" in message and "org/tiny-gguf" in message
    one_line_error(InvalidArgumentError, lambda: resolve_model("org/tiny-gguf:Q8_0", gguf_file="x.gguf"))


def test_the_cli_runs_a_hub_id_and_reports_hub_errors_in_one_line(env, capsys, checkpoint):
    args = ["--prompt", PROMPT, "--temperature", "0", "--max-tokens", "8", "--max-model-len", "128"]
    assert main(["generate", "org/tiny", *args]) == 0
    from_hub = capsys.readouterr().out
    assert main(["generate", checkpoint, *args]) == 0
    assert capsys.readouterr().out == from_hub
    assert main(["generate", "org/tiny", "--revision", "v9", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'v9'" in err and "Traceback" not in err
    assert main(["serve", "org/missing", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "'org/missing'" in err[-1]


def test_fastdeploy_serve_a_hub_id(env, checkpoint, tmp_path):
    """`fastdeploy serve org/tiny` in its own process downloads the model, serves it under its id,
    and answers as the same files do by path."""
    llm = LLM(model=checkpoint, max_model_len=64, num_gpu_blocks_override=4)
    expected = llm.generate([PROMPT], GREEDY)[0].outputs.text
    llm.shutdown()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "fastdeploy",
        "serve",
        "org/tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    command += ["--max-model-len", "64", "--num-gpu-blocks-override", "4", "--uvicorn-log-level", "warning"]
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not _healthy(url):
            assert process.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "the server did not become healthy:\n" + log_path.read_text()
            time.sleep(0.1)
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "org/tiny"
        payload = {
            "model": "org/tiny",
            "prompt": PROMPT,
            "max_tokens": 24,
            "temperature": 0,
            "ignore_eos": True,
        }
        reply = httpx.post(url + "/v1/completions", json=payload, timeout=120).json()
        assert reply["choices"][0]["text"] == expected
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
