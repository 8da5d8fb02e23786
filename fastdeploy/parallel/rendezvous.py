"""Where a rank finds the others: the environment both launch paths set, and a reachability check.

Ranks started by the engine on one host and ranks started by `paddle.distributed.launch` on
several hosts see the same variables (the launcher's names): PADDLE_TRAINER_ID (global rank),
PADDLE_TRAINERS_NUM (world size), PADDLE_MASTER (host:port of the rendezvous store rank 0
opens), PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT, PADDLE_LOCAL_RANK and
PADDLE_LOCAL_SIZE (this rank's index among its host's ranks, and their number).
"""

from __future__ import annotations

import os
import socket
import time

from fastdeploy.errors import DistributedInitError
from fastdeploy.parallel.communicator import RendezvousInfo


def rendezvous_environment(
    rank: int, world_size: int, master: str, endpoints: list[str], local_rank: int, local_size: int
) -> dict[str, str]:
    """The variables of one rank, as paddle.distributed.launch sets them."""
    return {
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(world_size),
        "PADDLE_MASTER": master,
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
        "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_LOCAL_RANK": str(local_rank),
        "PADDLE_LOCAL_SIZE": str(local_size),
    }


def rendezvous_from_environment(timeout: float) -> RendezvousInfo:
    """This rank's `RendezvousInfo` from the launch variables."""
    try:
        rank = int(os.environ["PADDLE_TRAINER_ID"])
        world_size = int(os.environ["PADDLE_TRAINERS_NUM"])
        master = os.environ["PADDLE_MASTER"]
    except KeyError as exc:
        raise DistributedInitError(
            f"a rank process needs {exc.args[0]} in its environment (set by the engine or by "
            "paddle.distributed.launch)"
        ) from exc
    endpoints = tuple(filter(None, os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")))
    return RendezvousInfo(
        rank=rank,
        world_size=world_size,
        master=master,
        timeout=timeout,
        endpoints=endpoints,
        local_device=int(os.environ.get("PADDLE_LOCAL_RANK", "0")),
    )


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def wait_until_reachable(address: str, timeout: float, what: str) -> None:
    """Poll a TCP connection to `address` until it is accepted; DistributedInitError after `timeout` s.

    Ranks other than 0 call this before joining the framework's rendezvous, so an unreachable
    rank 0 is reported with its address instead of hanging in the framework's retries (and a
    rank that starts first does not sleep through the framework's multi-second retry interval).
    """
    host, port = split_address(address)
    deadline = time.monotonic() + timeout
    last_error: OSError | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(1.0, timeout)):
                return
        except OSError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise DistributedInitError(
                f"cannot reach {what} at {address} within {timeout:g} s ({last_error}); check that "
                "every host runs fastdeploy with the same --ips and that the port is open"
            )
        time.sleep(0.02)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (for rendezvous addresses on this host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
