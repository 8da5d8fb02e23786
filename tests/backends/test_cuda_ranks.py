"""How the cuda backend's rank processes (tensor / pipeline / data parallelism) find their GPU and
their collectives, checked without a GPU: the choices are made from environment variables and
the runtime choice before any framework is imported."""

from __future__ import annotations

import pytest

from fastdeploy.backends.cuda import backend as cuda_backend
from fastdeploy.backends.cuda import gpu_probe
from fastdeploy.backends.cuda.backend import CudaBackend
from fastdeploy.backends.cuda.runtimes import GpuRuntimeChoice
from fastdeploy.errors import InvalidArgumentError


@pytest.mark.parametrize(("runtime", "communicator"), [("torch", "torch"), ("paddle", "paddle")])
def test_ranks_use_the_collectives_of_the_runtime_that_holds_the_tensors(monkeypatch, runtime, communicator):
    from fastdeploy.distributed.selection import communicator_class
    from fastdeploy.plugins.registry import get_registry

    monkeypatch.delenv("FD_COMMUNICATOR", raising=False)
    monkeypatch.setattr(cuda_backend, "choose_gpu_runtime", lambda: GpuRuntimeChoice(runtime, "test"))
    assert CudaBackend.communicator_name() == communicator
    if communicator == "torch":
        pytest.importorskip("torch")
        assert communicator_class(CudaBackend, get_registry()).name == "torch"


def test_each_rank_sees_only_its_own_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,GPU-8f1c")
    assert CudaBackend.device_count() == 3
    assert CudaBackend.rank_environment(1) == {"CUDA_VISIBLE_DEVICES": "5", "FLAGS_selected_gpus": "0"}
    assert CudaBackend.rank_environment(2)["CUDA_VISIBLE_DEVICES"] == "GPU-8f1c"
    with pytest.raises(InvalidArgumentError, match="rank 3 of this host needs GPU number 3, but only 3"):
        CudaBackend.rank_environment(3)


def test_visible_gpus_follow_cuda_rules(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 2,-1,4")  # CUDA stops at the first invalid entry
    assert gpu_probe.visible_gpu_ids() == ["0", "2"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(gpu_probe.glob, "glob", lambda pattern: ["a", "b"] if "proc" in pattern else [])
    assert gpu_probe.visible_gpu_ids() == ["0", "1"]


def test_a_launcher_selected_gpu_is_the_one_used(monkeypatch):
    monkeypatch.delenv("FLAGS_selected_gpus", raising=False)
    assert gpu_probe.local_gpu_index() == 0
    monkeypatch.setenv("FLAGS_selected_gpus", "2")
    assert gpu_probe.local_gpu_index() == 2
