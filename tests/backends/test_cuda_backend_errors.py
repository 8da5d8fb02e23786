"""The cuda backend's refusals that need a GPU to happen, checked with stand-ins for the GPU:
bfloat16 before sm_80, the dtype "auto" picks, and out-of-memory while sizing the KV cache."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fastdeploy.backends.base import KVCacheSpec
from fastdeploy.backends.cuda import backend as cuda_backend
from fastdeploy.backends.cuda.backend import CudaBackend, TensorBackend
from fastdeploy.backends.cuda.runtimes import GpuRuntimeChoice
from fastdeploy.errors import InvalidArgumentError


class FakeRuntime:
    name = "torch"

    def __init__(self, capability=(9, 0), fail_zeros=False):
        self.capability = capability
        self.fail_zeros = fail_zeros

    def compute_capability(self):
        return self.capability

    def zeros(self, shape, dtype):
        if self.fail_zeros:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return ("zeros", tuple(shape), dtype)


def _gpu_backend(dtype, runtime):
    return SimpleNamespace(on_gpu=True, dtype=dtype, rt=runtime, name="cuda", num_kv_heads=0)


def test_bfloat16_is_refused_before_ampere_with_the_reason():
    with pytest.raises(InvalidArgumentError) as error:
        TensorBackend._check_dtype(_gpu_backend("bfloat16", FakeRuntime((7, 5))))
    assert str(error.value) == (
        "dtype='bfloat16' needs an NVIDIA GPU of compute capability 8.0 (Ampere) or newer; this GPU is "
        "sm_75: pass dtype='float16' or 'float32'"
    )
    TensorBackend._check_dtype(_gpu_backend("float16", FakeRuntime((7, 5))))  # accepted
    TensorBackend._check_dtype(_gpu_backend("bfloat16", FakeRuntime((8, 0))))  # accepted


@pytest.mark.parametrize(
    ("capability", "expected"), [((9, 0), "bfloat16"), ((8, 6), "bfloat16"), ((7, 0), "float16")]
)
def test_auto_dtype_is_bfloat16_where_the_gpu_has_it(monkeypatch, capability, expected):
    monkeypatch.setattr(cuda_backend, "choose_gpu_runtime", lambda: GpuRuntimeChoice("torch", "test"))
    monkeypatch.setattr(cuda_backend.torch_runtime, "gpu_capability", lambda: capability)
    assert CudaBackend.resolve_default_dtype() == expected


def test_kv_cache_allocation_out_of_memory_names_the_figure_and_the_flags():
    fake = _gpu_backend("bfloat16", FakeRuntime(fail_zeros=True))
    spec = KVCacheSpec(
        num_layers=16, num_blocks=4096, block_size=64, num_kv_heads=8, head_dim=128, dtype="bfloat16"
    )
    with pytest.raises(InvalidArgumentError) as error:
        TensorBackend.allocate_kv_cache(fake, spec)
    assert str(error.value) == (
        "allocating the KV cache (4096 blocks, 16.00 GiB) ran out of memory; lower gpu_memory_utilization, "
        "kv_cache_memory or num_gpu_blocks_override"
    )


def test_profiling_out_of_memory_names_max_num_batched_tokens():
    class Memory:
        def total(self):
            return 80 * 2**30

        def allocated(self):
            return 2 * 2**30

        def synchronize(self):
            pass

        def reset_peak(self):
            pass

        def peak(self):
            return 0

    def forward():
        raise RuntimeError("CUDA out of memory. Tried to allocate 64.00 GiB")

    fake = SimpleNamespace(memory=Memory())
    with pytest.raises(
        InvalidArgumentError,
        match=r"ran out of GPU memory \(80.0 GiB total, weights 2.00 GiB\): lower max_num_batched_tokens",
    ):
        TensorBackend.kv_cache_budget_bytes(fake, 0.9, forward)
