"""Registers the built-in communicators through the `fastdeploy.plugins` entry point."""

from fastdeploy.parallel.paddle_communicator import PaddleCommunicator
from fastdeploy.parallel.torch_communicator import TorchCommunicator
from fastdeploy.plugins.hookspecs import hookimpl


@hookimpl
def fastdeploy_communicators() -> dict[str, type]:
    return {PaddleCommunicator.name: PaddleCommunicator, TorchCommunicator.name: TorchCommunicator}
