"""The collectives interface: what tensor and pipeline parallelism need from a framework.

A communicator wraps one distributed runtime (paddle.distributed, torch.distributed, a vendor's
HCCL binding) for the arrays of one device backend. Every rank builds one, with the same
`RendezvousInfo`, before the model; the model then calls it through
`fastdeploy.parallel.model_parallel.ModelParallel`. Device plugins register theirs through
the `fastdeploy_communicators` hook and name it in `Backend.communicator`.

Groups: `new_group(ranks)` is itself collective: every rank calls it for every group, in the same
order, as the frameworks require. Arrays are the backend's device arrays; a communicator accepts
them as they are (numpy arrays are handed to the framework through DLPack, without copies).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class RendezvousInfo:
    """Where the ranks of one model replica meet, and who this rank is."""

    rank: int
    world_size: int
    #: "host:port" of the rendezvous store rank 0 opens (paddle's PADDLE_MASTER, torch's MASTER_ADDR/PORT)
    master: str
    #: seconds a rank waits to reach the rendezvous before it gives up with an error
    timeout: float
    #: "host:port" of every rank, for frameworks that want them (paddle's PADDLE_TRAINER_ENDPOINTS)
    endpoints: tuple[str, ...] = ()
    #: index of the device this rank uses on its host (GPU ordinal); 0 on the CPU
    local_device: int = 0


class Communicator(ABC):
    """Collectives over a backend's device arrays; subclasses wrap one distributed runtime.

    A subclass is registered through `fastdeploy_communicators` under `name`. The engine builds it
    as `cls(backend, rendezvous)` in every rank process; `__init__` joins the process group and
    raises `DistributedInitError` (with the address and the time-out) if the rank cannot reach
    the others.
    """

    name: ClassVar[str]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when the runtime can be used here, else what to install (cheap: no imports of it)."""
        return None

    @classmethod  # noqa: B027 - optional: a runtime that imports fast needs nothing
    def preload(cls) -> None:
        """Import the runtime ahead of construction; called on a background thread while the
        rank loads its shard (construction and collectives then run on the rank's main thread)."""

    @abstractmethod
    def new_group(self, ranks: list[int]) -> Any:
        """An opaque group of `ranks`; called by every rank for every group, in the same order."""

    @abstractmethod
    def all_reduce(self, x: Any, group: Any) -> Any:
        """Elementwise sum of `x` over the group's ranks; every rank gets the sum (may reuse x)."""

    @abstractmethod
    def all_gather(self, x: Any, group: Any) -> Any:
        """The group's arrays (same shape on every rank) concatenated along the last axis in rank order."""

    @abstractmethod
    def broadcast(self, x: Any, src: int, group: Any) -> Any:
        """`x` of global rank `src`, on every rank of the group (x is the receive buffer elsewhere)."""

    @abstractmethod
    def send(self, x: Any, dst: int) -> None:
        """Send `x` to global rank `dst` (pipeline stages hand activations on)."""

    @abstractmethod
    def recv(self, x: Any, src: int) -> Any:
        """Receive into `x` (a buffer of the sent shape and dtype) from global rank `src`; returns it."""

    def barrier(self) -> None:  # noqa: B027 - optional: runtimes without one need nothing here
        """Wait until every rank of the world reaches this point."""

    def close(self) -> None:  # noqa: B027 - optional: most runtimes clean up at exit
        """Release the process group (called once, when the worker stops)."""
