"""Registers the cuda backend and its CPU twins ("cuda", "paddle-cpu", "torch-cpu").

Importing this module must stay cheap and must not import paddle: `fastdeploy env` and
`device="auto"` only call the classes' `unavailable_reason()`. (The entry point keeps its old
name, `fastdeploy.paddle_backends`.)
"""

from fastdeploy.backends.cuda.backend import CudaBackend, PaddleCpuBackend, TorchCpuBackend
from fastdeploy.plugins.hookspecs import hookimpl


@hookimpl
def fastdeploy_device_backends() -> dict[str, type]:
    return {backend.name: backend for backend in (CudaBackend, PaddleCpuBackend, TorchCpuBackend)}
