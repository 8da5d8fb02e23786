"""Collectives through paddle.distributed: gloo on the CPU, NCCL on CUDA GPUs.

The default communicator of the built-in backends. Arrays of the cpu backend (numpy) are handed
to paddle through DLPack, so an all-reduce sums in place in the numpy array's memory, without
copies; paddle tensors (the Paddle backends) are used as they are.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.backends.cuda.runtimes.paddle_runtime import import_paddle
from fastdeploy.errors import DistributedInitError
from fastdeploy.logger import get_logger
from fastdeploy.parallel.communicator import Communicator, RendezvousInfo
from fastdeploy.parallel.rendezvous import split_address, wait_until_reachable
from fastdeploy.parallel.shm_collectives import SharedMemoryCollectives

logger = get_logger(__name__)

#: ids of subgroups made by `new_group` (paddle numbers its own groups from 1)
_SUBGROUP_IDS = 1000
INSTALL_HINT = "pip install 'fastdeploy[distributed]' (paddlepaddle; paddlepaddle-gpu for NCCL on GPUs)"


@contextlib.contextmanager
def _torch_hidden_unless_imported(framework: str) -> Iterator[None]:
    """`import torch` fails inside the block unless torch or `framework` is imported already;
    afterwards torch imports normally again."""
    if "torch" in sys.modules or framework in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        yield
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


def _no_delay(address: str) -> None:
    """Set TCP_NODELAY on this process's connections to `address` (the client of paddle's TCPStore).

    paddle 3.3's store client writes each request in several small sends (command, key length,
    key, value) on a socket without TCP_NODELAY, so Nagle's algorithm holds every send after the
    first until the store acknowledges it, and Linux delays that acknowledgement by 40 ms: a gloo
    group takes several requests per rank to form, 0.3 s for two ranks measured here, 0.01 s with
    TCP_NODELAY. paddle does not expose the socket, so it is found among the process's descriptors
    (/proc/self/fd, Linux); elsewhere this does nothing.
    """
    host, port = split_address(address)
    try:
        peers = {info[4][0] for info in socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)}
        descriptors = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in descriptors:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue  # not a socket (or closed meanwhile)
        try:
            if sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM:
                peer_host, peer_port = sock.getpeername()
                if peer_port == port and peer_host in peers:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # a listening or unconnected socket
        finally:
            sock.detach()  # the descriptor stays open, owned by whoever opened it


class PaddleCommunicator(Communicator):
    """paddle.distributed over the global group and `new_group` subgroups."""

    name = "paddle"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        for distribution in ("paddlepaddle-gpu", "paddlepaddle"):
            try:
                importlib.metadata.version(distribution)
                return None
            except importlib.metadata.PackageNotFoundError:
                continue
        return f"paddle.distributed is needed for more than one rank and paddlepaddle is not installed: {INSTALL_HINT}"

    @classmethod
    def preload(cls) -> None:
        """Import paddle.distributed, with torch hidden when this rank's backend uses neither
        framework (neither is imported yet: the backend is built first, and a paddle or torch
        backend imports its framework then). Where torch is installed, paddle's tvm_ffi
        dependency imports it anyway: 1.7 s of a 3.4 s `import paddle` measured here, per rank."""

        with _torch_hidden_unless_imported("paddle"):
            import_paddle()
            import paddle.distributed  # noqa: F401

    def __init__(self, backend: Backend, rendezvous: RendezvousInfo) -> None:
        on_gpu = bool(getattr(backend, "on_gpu", False))
        os.environ["PADDLE_DISTRI_BACKEND"] = "nccl" if on_gpu else "gloo"
        if on_gpu:
            os.environ.setdefault("FLAGS_selected_gpus", "0")
        if rendezvous.rank != 0:
            wait_until_reachable(rendezvous.master, rendezvous.timeout, "the rendezvous of rank 0")

        self.paddle = import_paddle()
        import paddle.distributed as dist

        self.dist = dist
        # paddle's eager mode is per thread, on for the thread that imported it: `preload` may
        # have imported it on another one (in static mode init_parallel_env takes a legacy path)
        self.paddle.disable_static()
        try:
            # init_parallel_env takes this store (it is made once per process): its client is
            # made quick before the group forms in it
            from paddle.base import core

            core.create_or_get_global_tcp_store()
            _no_delay(rendezvous.master)
            dist.init_parallel_env()
        except Exception as exc:
            raise DistributedInitError(
                f"rank {rendezvous.rank} could not join paddle.distributed's group of {rendezvous.world_size} "
                f"at {rendezvous.master}: {type(exc).__name__}: {exc}"
            ) from exc
        self.rank = rendezvous.rank
        self.world_size = rendezvous.world_size
        self.endpoints = rendezvous.endpoints
        self.timeout = rendezvous.timeout
        self._stores: list[Any] = []  # subgroup stores live as long as their groups
        self._on_gpu = on_gpu
        #: id(group) -> (group, its shared-memory collectives) for the groups on this host alone
        self._shm: dict[int, tuple[Any, SharedMemoryCollectives]] = {}
        self._add_shm_collectives(None, list(range(self.world_size)))

    def _tensor(self, x: Any) -> Any:
        """A paddle tensor sharing x's memory (DLPack for numpy and other frameworks)."""
        if isinstance(x, self.paddle.Tensor):
            return x
        if isinstance(x, np.ndarray):
            x = np.ascontiguousarray(x)
        return self.paddle.utils.dlpack.from_dlpack(x)

    def new_group(self, ranks: list[int]) -> Any:
        """The world's group for the whole world; otherwise, for gloo, a group with a store of its own.

        paddle 3.3's gloo subgroups all meet in the global store without their own key prefix,
        and two groups forming at once (the tensor-parallel groups of two pipeline stages) can
        pair ranks of different groups and hang (reproduced here about one start in three).
        Each subgroup therefore rendezvouses in its own TCP store, opened by its first rank at
        that rank's endpoint (PADDLE_TRAINER_ENDPOINTS, reserved for it by the launcher).
        """
        ranks = sorted(ranks)
        if ranks == list(range(self.world_size)):
            return None  # paddle's default (global) group
        if os.environ["PADDLE_DISTRI_BACKEND"] != "gloo":
            return self.dist.new_group(ranks)
        if self.rank not in ranks:
            return None
        from paddle.base import core
        from paddle.distributed.collective import Group

        address = self.endpoints[ranks[0]]
        host, port = split_address(address)
        is_master = self.rank == ranks[0]
        if not is_master:
            wait_until_reachable(address, self.timeout, f"the group of ranks {ranks}")
        store = core.TCPStore(host, port, is_master, len(ranks), int(self.timeout))
        _no_delay(address)
        group_id = _SUBGROUP_IDS + ranks[0]
        process_group = core.ProcessGroupGloo.create(store, ranks.index(self.rank), len(ranks), group_id)
        self._stores.append(store)
        group = Group(
            ranks.index(self.rank), group_id, ranks, pg=process_group, name=f"fastdeploy_{group_id}"
        )
        self._add_shm_collectives(group, ranks)
        return group

    def _add_shm_collectives(self, group: Any, ranks: list[int]) -> None:
        """Give a CPU group whose ranks all run on this host its shared-memory collectives."""
        hosts = {split_address(self.endpoints[rank])[0] for rank in ranks} if self.endpoints else {None}
        if self._on_gpu or len(ranks) < 2 or len(hosts) != 1 or not SharedMemoryCollectives.usable():
            return

        def share_name(name: bytes) -> bytes:
            buffer = np.frombuffer(bytearray(name), np.uint8)
            self.dist.broadcast(self._tensor(buffer), src=ranks[0], group=group)
            return buffer.tobytes()

        def all_agree(ok: bool) -> bool:
            votes = np.array([1.0 if ok else 0.0], np.float32)
            self.dist.all_reduce(self._tensor(votes), group=group)
            return int(votes[0]) == len(ranks)

        try:
            shm = SharedMemoryCollectives(
                ranks.index(self.rank), len(ranks), share_name, all_agree, self.timeout
            )
        except OSError as exc:
            logger.warning("ranks %s keep their collectives on gloo: %s", ranks, exc)
            return
        self._shm[id(group)] = (group, shm)

    def all_reduce(self, x: Any, group: Any) -> Any:
        if isinstance(x, np.ndarray) and not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        fast = self._shm.get(id(group))
        if fast is not None and isinstance(x, np.ndarray) and x.dtype == np.float32:
            return fast[1].all_reduce(x)
        self.dist.all_reduce(self._tensor(x), group=group)
        return x

    def all_gather(self, x: Any, group: Any) -> Any:
        fast = self._shm.get(id(group))
        if fast is not None and isinstance(x, np.ndarray) and x.dtype == np.float32:
            return fast[1].all_gather(np.ascontiguousarray(x))
        parts: list[Any] = []
        self.dist.all_gather(parts, self._tensor(x), group=group)
        if isinstance(x, self.paddle.Tensor):
            return self.paddle.concat(parts, axis=-1)
        return np.concatenate([part.numpy() for part in parts], axis=-1)

    def broadcast(self, x: Any, src: int, group: Any) -> Any:
        if isinstance(x, np.ndarray) and not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        self.dist.broadcast(self._tensor(x), src=src, group=group)
        return x

    def send(self, x: Any, dst: int) -> None:
        self.dist.send(self._tensor(x), dst=dst)

    def recv(self, x: Any, src: int) -> Any:
        self.dist.recv(self._tensor(x), src=src)
        return x

    def barrier(self) -> None:
        self.dist.barrier()
