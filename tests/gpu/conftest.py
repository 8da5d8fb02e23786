"""Tests marked `gpu` run the engine on an NVIDIA GPU against transformers on the same GPU.

They are collected everywhere and skipped, with the reason, where no GPU is usable (CI here).
`FD_GPU_TEST_DEVICE=torch-cpu FD_GPU_TEST_SHAPES=tiny` runs the same comparisons on the CPU at toy
sizes, which is how their code was checked without a GPU.
"""

from __future__ import annotations

import os

import pytest


def gpu_skip_reason() -> str | None:
    if os.environ.get("FD_GPU_TEST_DEVICE", "cuda") != "cuda":
        return None
    from fastdeploy.backends.cuda.backend import CudaBackend

    reason = CudaBackend.unavailable_reason()
    if reason is not None:
        return f"no usable NVIDIA GPU: {reason}"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "the GPU comparisons need transformers (pip install transformers)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_skip_reason() or "run"
            if reason != "run":
                item.add_marker(pytest.mark.skip(reason=reason))
