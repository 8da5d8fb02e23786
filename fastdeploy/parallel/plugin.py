"""Registers the built-in communicators and KV transports through the `fastdeploy.plugins` entry point."""

from fastdeploy.parallel.paddle_communicator import PaddleCommunicator
from fastdeploy.parallel.torch_communicator import TorchCommunicator
from fastdeploy.parallel.zmq_kv_transport import ZmqKVTransport
from fastdeploy.plugins.hookspecs import hookimpl


@hookimpl
def fastdeploy_communicators() -> dict[str, type]:
    return {PaddleCommunicator.name: PaddleCommunicator, TorchCommunicator.name: TorchCommunicator}


@hookimpl
def fastdeploy_kv_transports() -> dict[str, type]:
    return {ZmqKVTransport.name: ZmqKVTransport}
