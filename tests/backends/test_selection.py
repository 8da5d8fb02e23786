"""Device selection: device=, FD_DEVICE, --device, "auto", the cuda backend and the vendor stubs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from fastdeploy import LLM
from fastdeploy.backends.cpu import native
from fastdeploy.backends.stubs import STUBS
from fastdeploy.errors import BackendUnavailableError, InvalidArgumentError

VENDORS = {
    "xpu": "KunlunXin",
    "dcu": "Hygon",
    "npu": "Ascend",
    "gcu": "Enflame",
    "iluvatar": "Iluvatar",
    "metax": "MetaX",
}


@pytest.mark.parametrize("device", sorted(VENDORS))
def test_stub_fails_at_construction_naming_device_and_interface(device, smollm2_path):
    start = time.perf_counter()
    with pytest.raises(BackendUnavailableError) as error:
        LLM(model=smollm2_path, device=device)
    message = str(error.value)
    assert f"the {device} backend cannot run here" in message
    assert VENDORS[device] in message and "not implemented" in message
    assert "fastdeploy.backends.base.Backend" in message and "fastdeploy_device_backends" in message
    assert time.perf_counter() - start < 5  # before any weights are loaded


def test_every_stub_is_registered():
    from fastdeploy.plugins.registry import get_registry

    backends = get_registry().device_backends()
    assert {stub.device for stub in STUBS} == set(VENDORS)
    for device in VENDORS:
        assert backends[device].unavailable_reason().startswith("not implemented")


def test_stub_class_cannot_be_built_directly():
    from fastdeploy.backends.base import BackendOptions
    from fastdeploy.plugins.registry import get_registry

    with pytest.raises(BackendUnavailableError, match="Ascend"):
        get_registry().device_backends()["npu"](BackendOptions())


def test_cuda_fails_fast_saying_what_is_missing(smollm2_path):
    pytest.importorskip("paddle", reason="the message names the installed paddlepaddle build")
    from fastdeploy.backends.cuda.runtime import installed_paddle

    distribution, version = installed_paddle()
    if distribution != "paddlepaddle":
        pytest.skip(f"{distribution} is installed: this test is for the CPU build of paddlepaddle")
    start = time.perf_counter()
    with pytest.raises(BackendUnavailableError) as error:
        LLM(model=smollm2_path, device="cuda")
    assert str(error.value) == (
        "the cuda backend cannot run here: cuda backend needs paddlepaddle-gpu built with CUDA and a "
        f"visible GPU; found paddlepaddle {version} (CPU build)"
    )
    assert time.perf_counter() - start < 5


def test_cuda_reason_without_paddle(monkeypatch):
    from fastdeploy.backends.cuda import runtime

    monkeypatch.setattr(runtime, "installed_paddle", lambda: None)
    assert runtime.gpu_unavailable_reason().endswith("paddlepaddle is not installed")
    assert runtime.paddle_unavailable_reason().startswith("paddlepaddle is not installed")


def test_unknown_device_lists_registered_ones(smollm2_path):
    with pytest.raises(InvalidArgumentError, match=r"'tpu' is not a registered backend.*cpu.*cuda.*xpu"):
        LLM(model=smollm2_path, device="tpu")


def test_fd_device_selects_the_backend(monkeypatch, smollm2_path):
    monkeypatch.setenv("FD_DEVICE", "xpu")
    with pytest.raises(BackendUnavailableError, match="KunlunXin"):
        LLM(model=smollm2_path)


def test_auto_picks_the_best_available_backend():
    from fastdeploy.backends.selection import select_backend_class
    from fastdeploy.plugins.registry import get_registry

    registry = get_registry()
    available = {
        name: cls for name, cls in registry.device_backends().items() if cls.unavailable_reason() is None
    }
    chosen = select_backend_class("auto", registry)
    assert chosen.auto_priority == max(cls.auto_priority for cls in available.values())
    # here: no GPU, so the numpy cpu backend (paddle-cpu is only for checking the cuda code)
    if "cuda" not in available:
        assert chosen.name == "cpu"


def test_cli_device_flag_reaches_llm(smollm2_path):
    result = subprocess.run(
        [sys.executable, "-m", "fastdeploy", "generate", smollm2_path, "--device", "metax", "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "MetaX" in result.stderr and "not implemented" in result.stderr


def test_env_command_lists_backends_plugins_and_reasons():
    result = subprocess.run(
        [sys.executable, "-m", "fastdeploy", "env"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "device='auto' picks: cpu" in text or "device='auto' picks: cuda" in text
    for device, vendor in VENDORS.items():
        assert f"  {device} " in text and f"not implemented: the {vendor}" in text
    assert "fastdeploy.cpu_backend" in text and "LlamaForCausalLM" in text


def test_python_m_fastdeploy_env_json():
    result = subprocess.run(
        [sys.executable, "-m", "fastdeploy.env", "--json"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    backends = {backend["name"]: backend for backend in report["backends"]}
    assert backends["cpu"]["available"] and backends["cpu"]["reason"] is None
    expected_kernels = native.best_isa() if native.unavailable_reason() is None else "numpy kernels"
    assert expected_kernels in backends["cpu"]["details"]
    for device in VENDORS:
        assert not backends[device]["available"] and "stub" in backends[device]["reason"]
    assert backends["cuda"]["plugin"] == "fastdeploy.paddle_backends"
    if not backends["cuda"]["available"]:
        assert "cuda backend" in backends["cuda"]["reason"]
    names = {plugin["name"] for plugin in report["plugins"]}
    assert {"fastdeploy.cpu_backend", "fastdeploy.paddle_backends", "fastdeploy.accelerator_stubs"} <= names


def test_env_says_which_cpu_kernels_run(monkeypatch):
    monkeypatch.setenv("FD_CPU_KERNELS", "numpy")
    result = subprocess.run(
        [sys.executable, "-m", "fastdeploy", "env"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "runs: numpy kernels (FD_CPU_KERNELS=numpy)" in result.stdout


def test_default_thread_count_is_the_cores_this_process_may_use():
    from fastdeploy.backends.base import BackendOptions

    assert BackendOptions(threads=3).thread_count() == 3
    if hasattr(os, "sched_getaffinity"):
        assert BackendOptions().thread_count() == len(os.sched_getaffinity(0))
