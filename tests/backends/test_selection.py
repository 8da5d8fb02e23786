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
    assert "fastdeploy.plugins.api.Backend" in message and "fastdeploy_device_backends" in message
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
    """Here: no GPU, paddlepaddle's CPU build and torch's CPU build; the message names all three."""
    from fastdeploy.backends.cuda.runtimes import paddle_runtime, torch_runtime

    start = time.perf_counter()
    with pytest.raises(BackendUnavailableError) as error:
        LLM(model=smollm2_path, device="cuda")
    elapsed = time.perf_counter() - start
    message = str(error.value)
    assert message.startswith(
        "the cuda backend cannot run here: cuda backend needs a visible NVIDIA GPU and "
        "paddlepaddle-gpu or torch built with CUDA; paddle: "
    )
    paddle = paddle_runtime.installed_paddle()
    if paddle is not None and paddle[0] == "paddlepaddle":
        assert f"paddle: found paddlepaddle {paddle[1]}, the CPU build" in message
    build = torch_runtime._torch_build()
    if build is not None and build[1] is None:
        assert f"torch: found torch {build[0]} built without CUDA" in message
    from fastdeploy.backends.cuda.gpu_probe import visible_gpu_reason

    if visible_gpu_reason() is not None:
        assert message.endswith(f"; GPU: {visible_gpu_reason()}")
    assert elapsed < 1.0, f"took {elapsed:.2f} s"


def test_cuda_reason_without_either_framework(monkeypatch):
    from fastdeploy.backends.cuda import runtimes
    from fastdeploy.backends.cuda.runtimes import paddle_runtime, torch_runtime

    monkeypatch.setattr(paddle_runtime, "installed_paddle", lambda: None)
    monkeypatch.setattr(torch_runtime, "_torch_build", lambda: None)
    choice = runtimes.choose_gpu_runtime()
    assert choice.name is None
    assert "paddle: paddlepaddle-gpu is not installed; torch: torch is not installed" in choice.why
    assert paddle_runtime.paddle_unavailable_reason().startswith("paddlepaddle is not installed")


def test_fd_cuda_runtime_forces_one_and_says_why_it_cannot_run(monkeypatch):
    from fastdeploy.backends.cuda import runtimes
    from fastdeploy.backends.cuda.runtimes import torch_runtime

    monkeypatch.setattr(torch_runtime, "_torch_build", lambda: ("2.11.0+cu130", None))
    monkeypatch.setenv("FD_CUDA_RUNTIME", "torch")
    choice = runtimes.choose_gpu_runtime()
    assert (choice.name, choice.why) == (
        None,
        "FD_CUDA_RUNTIME=torch, but found torch 2.11.0+cu130 built without CUDA",
    )
    monkeypatch.setenv("FD_CUDA_RUNTIME", "jax")
    with pytest.raises(InvalidArgumentError, match="FD_CUDA_RUNTIME must be one of paddle, torch, got 'jax'"):
        runtimes.choose_gpu_runtime()


def test_torch_runtime_chosen_when_paddle_cannot_run(monkeypatch):
    """A GPU machine with torch + CUDA and no paddle (the GPU test machines): torch runs, and says why."""
    from fastdeploy.backends.cuda import runtimes
    from fastdeploy.backends.cuda.runtimes import paddle_runtime, torch_runtime

    monkeypatch.setattr(paddle_runtime, "installed_paddle", lambda: None)
    monkeypatch.setattr(torch_runtime, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setitem(runtimes._GPU_REASONS, "torch", torch_runtime.gpu_unavailable_reason)
    choice = runtimes.choose_gpu_runtime()
    assert choice.name == "torch"
    assert choice.why == "torch with CUDA, since paddle cannot run: paddlepaddle-gpu is not installed"


def test_torch_build_is_read_without_importing_torch():
    from fastdeploy.backends.cuda.runtimes import torch_runtime

    torch = pytest.importorskip("torch")
    version, cuda = torch_runtime._torch_build()
    assert version == torch.__version__ and cuda == torch.version.cuda


@pytest.mark.parametrize("visible", ["", "-1"])
def test_hidden_gpus_are_reported(monkeypatch, visible):
    from fastdeploy.backends.cuda.gpu_probe import visible_gpu_reason

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpu_reason() == f"no GPU is visible: CUDA_VISIBLE_DEVICES={visible!r} hides them all"


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
    else:
        assert "runtime" in backends["cuda"]["details"]
    assert backends["torch-cpu"]["auto_priority"] < 0 and backends["paddle-cpu"]["auto_priority"] < 0
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
