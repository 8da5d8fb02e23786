"""Registers the built-in communicators through the `fastdeploy.plugins` entry point."""

from fastdeploy.distributed.paddle_communicator import PaddleCommunicator
from fastdeploy.distributed.torch_communicator import TorchCommunicator
from fastdeploy.plugins.hookspecs import hookimpl


@hookimpl
def fastdeploy_communicators() -> dict[str, type]:
    return {PaddleCommunicator.name: PaddleCommunicator, TorchCommunicator.name: TorchCommunicator}
