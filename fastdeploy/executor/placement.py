"""Which hosts run the ranks of a model, which one this is, and how the ranks divide among them.

One host (the default): the engine starts every rank itself. Several hosts (FastDeploy's
`ips="10.0.0.1,10.0.0.2"`, the server's `--ips`): the same command runs on every host; the first
address is the master, whose engine schedules and samples and talks to every rank; each host
starts its own ranks with `paddle.distributed.launch`. A host finds its place in the list by the
addresses it owns, or from `FD_NODE_RANK` (needed when one machine plays several hosts, as the
loopback test does).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from fastdeploy.config import EngineConfig, parse_ips
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.parallel.topology import ParallelLayout

#: control port of the engine when ranks run on several hosts (FastDeploy's engine_worker_queue_port)
DEFAULT_CONTROL_PORT = 8002


def is_local_address(host: str) -> bool:
    """Whether `host` is an address of this machine (binding to it succeeds only then)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((socket.gethostbyname(host), 0))
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class Placement:
    """The hosts of one model replica and this process's host among them."""

    hosts: tuple[str, ...] = ("127.0.0.1",)
    node_rank: int = 0
    control_port: int = DEFAULT_CONTROL_PORT

    @property
    def multi_host(self) -> bool:
        return len(self.hosts) > 1

    @property
    def is_master(self) -> bool:
        return self.node_rank == 0

    @property
    def master(self) -> str:
        return self.hosts[0]

    def ranks_per_host(self, layout: ParallelLayout) -> int:
        return layout.world_size // len(self.hosts)

    def local_ranks(self, layout: ParallelLayout) -> range:
        per_host = self.ranks_per_host(layout)
        return range(self.node_rank * per_host, (self.node_rank + 1) * per_host)

    def host_of(self, rank: int, layout: ParallelLayout) -> str:
        return self.hosts[rank // self.ranks_per_host(layout)]


def find_placement(ips: str | list[str] | None, control_port: int | None) -> Placement:
    """This process's `Placement` for `ips` (one host when None)."""
    hosts = parse_ips(ips)
    port = control_port or DEFAULT_CONTROL_PORT
    if len(hosts) <= 1:
        return Placement(control_port=port)
    configured = os.environ.get("FD_NODE_RANK", "").strip()
    if configured:
        node_rank = int(configured)
        if not 0 <= node_rank < len(hosts):
            raise InvalidArgumentError(
                f"FD_NODE_RANK={node_rank} is outside the {len(hosts)} hosts of ips={','.join(hosts)}"
            )
        return Placement(hosts, node_rank, port)
    mine = [index for index, host in enumerate(hosts) if is_local_address(host)]
    if len(mine) != 1:
        why = "none of them is an address of this host" if not mine else "several of them are this host"
        raise InvalidArgumentError(
            f"cannot tell which of ips={','.join(hosts)} this host is: {why}; set FD_NODE_RANK to its index"
        )
    return Placement(hosts, mine[0], port)


def check_placement(
    placement: Placement, layout: ParallelLayout, devices_per_host: int | None, device: str
) -> None:
    """The ranks must divide evenly over the hosts, and fit the devices of each host."""
    hosts = len(placement.hosts)
    world = layout.world_size
    sizes = (
        f"tensor_parallel_size x pipeline_parallel_size = {layout.tensor_parallel_size} x "
        f"{layout.pipeline_parallel_size} = {world} ranks"
    )
    if world % hosts:
        raise InvalidArgumentError(f"{sizes} cannot be split evenly over the {hosts} hosts of ips")
    per_host = world // hosts
    if devices_per_host is not None and per_host > devices_per_host:
        where = "this host" if hosts == 1 else f"each of the {hosts} hosts"
        raise InvalidArgumentError(
            f"{sizes}, {per_host} per host, but {where} has {devices_per_host} {device} device(s) available"
        )


def is_master_host(config: EngineConfig) -> bool:
    """Whether this process drives the model (one host, or the first of `ips`)."""
    return not config.ips or find_placement(config.ips, config.engine_worker_queue_port).is_master
