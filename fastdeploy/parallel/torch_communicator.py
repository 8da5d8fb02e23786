"""Collectives through torch.distributed: gloo on the CPU, NCCL on CUDA GPUs.

For backends whose arrays are torch tensors (a torch runtime of the cuda backend), and usable
on the cpu backend too (`FD_COMMUNICATOR=torch`): numpy arrays become torch tensors without
copies (`torch.from_numpy`), so sums land in the numpy array's memory.
"""

from __future__ import annotations

import datetime
import importlib.metadata
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.errors import DistributedInitError
from fastdeploy.parallel.communicator import Communicator, RendezvousInfo
from fastdeploy.parallel.rendezvous import wait_until_reachable


class TorchCommunicator(Communicator):
    """torch.distributed over the default group and `new_group` subgroups."""

    name = "torch"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return "the torch communicator needs torch (pip install torch)"
        return None

    @classmethod
    def preload(cls) -> None:
        import torch.distributed  # noqa: F401

    def __init__(self, backend: Backend, rendezvous: RendezvousInfo) -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        on_gpu = bool(getattr(backend, "on_gpu", False))
        if rendezvous.rank != 0:
            wait_until_reachable(rendezvous.master, rendezvous.timeout, "the rendezvous of rank 0")
        try:
            dist.init_process_group(
                "nccl" if on_gpu else "gloo",
                init_method=f"tcp://{rendezvous.master}",
                rank=rendezvous.rank,
                world_size=rendezvous.world_size,
                timeout=datetime.timedelta(seconds=max(rendezvous.timeout, 1.0)),
            )
        except Exception as exc:
            raise DistributedInitError(
                f"rank {rendezvous.rank} could not join torch.distributed's group of {rendezvous.world_size} "
                f"at {rendezvous.master}: {type(exc).__name__}: {exc}"
            ) from exc

    def _tensor(self, x: Any) -> Any:
        if isinstance(x, self.torch.Tensor):
            return x
        if isinstance(x, np.ndarray):
            return self.torch.from_numpy(x)
        return self.torch.from_dlpack(x)

    @staticmethod
    def _contiguous(x: Any) -> Any:
        return np.ascontiguousarray(x) if isinstance(x, np.ndarray) and not x.flags.c_contiguous else x

    def new_group(self, ranks: list[int]) -> Any:
        return self.dist.new_group(ranks)

    def all_reduce(self, x: Any, group: Any) -> Any:
        x = self._contiguous(x)
        self.dist.all_reduce(self._tensor(x), group=group)
        return x

    def all_gather(self, x: Any, group: Any) -> Any:
        tensor = self._tensor(self._contiguous(x))
        parts = [self.torch.empty_like(tensor) for _ in range(self.dist.get_world_size(group))]
        self.dist.all_gather(parts, tensor, group=group)
        gathered = self.torch.cat(parts, dim=-1)
        return gathered.numpy() if isinstance(x, np.ndarray) else gathered

    def broadcast(self, x: Any, src: int, group: Any) -> Any:
        x = self._contiguous(x)
        self.dist.broadcast(self._tensor(x), src=src, group=group)
        return x

    def send(self, x: Any, dst: int) -> None:
        self.dist.send(self._tensor(self._contiguous(x)), dst=dst)

    def recv(self, x: Any, src: int) -> Any:
        self.dist.recv(self._tensor(x), src=src)
        return x

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
