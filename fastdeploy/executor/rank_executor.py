"""The engine's side of a model that runs in rank processes: start, feed and supervise them.

The engine process (the driver) keeps the scheduler, the KV block tables and the sampler; the
ranks hold the model shards and KV caches. Every step the driver sends the host batch layout to
every rank, and the output rank (tensor-parallel rank 0 of the last pipeline stage) sends the
logits back. With pipeline parallelism several steps may be in flight (`submit` / `collect`).

Supervision: while it waits, the driver watches every rank's connection and every child
process. A rank that fails to start, raises, or dies makes the next call raise
`WorkerFailedError` naming the rank, how it ended and the last lines of its log; all other
ranks are killed then (they may be blocked in a collective and never notice), and they are
killed too when the engine exits or is garbage-collected, so no rank outlives it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

from fastdeploy import envs
from fastdeploy.backends.base import Backend, BatchLayout
from fastdeploy.config import EngineConfig
from fastdeploy.errors import DistributedInitError, InvalidArgumentError, WorkerFailedError
from fastdeploy.executor import protocol
from fastdeploy.executor.base import PassOutput
from fastdeploy.executor.forkserver import server_environment, shared_server, uses_fork_server
from fastdeploy.executor.placement import Placement
from fastdeploy.executor.processes import ChildProcess, kill_children, start_child, stop_children, tail
from fastdeploy.executor.protocol import AUTHKEY_ENV, PARENT_ENV
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.batch import ScheduledBatch
from fastdeploy.model_executor.model_runner import build_layout
from fastdeploy.parallel.rendezvous import free_port, rendezvous_environment
from fastdeploy.parallel.topology import ParallelLayout, rank_name

logger = get_logger(__name__)

#: how often the driver looks at children without a pidfd while it waits, in seconds
_POLL_SECONDS = 0.2
#: seconds ranks get to exit by themselves on shutdown before they are killed
_SHUTDOWN_GRACE = 5.0
#: seconds a rank's error waits for another rank's death to show: a rank killed in a collective
#: breaks its peers' connections a moment before the kernel reports its exit, and it is the cause
_CAUSE_GRACE = 1.0


def _authkey(placement: Placement) -> bytes:
    """The control connection's HMAC key: FD_DIST_AUTHKEY (hex, the same on every host), else a
    fresh one on one host, or one derived from the hosts and port on several (which only keeps
    other deployments out: set FD_DIST_AUTHKEY where others can reach the port)."""
    configured = os.environ.get(AUTHKEY_ENV, "").strip()
    if configured:
        return bytes.fromhex(configured)
    if not placement.multi_host:
        return secrets.token_bytes(16)
    logger.warning(
        "FD_DIST_AUTHKEY is not set: the ranks' control port %d accepts any peer that knows the hosts and port",
        placement.control_port,
    )
    return hashlib.sha256(
        f"fastdeploy:{','.join(placement.hosts)}:{placement.control_port}".encode()
    ).digest()


class _Children:
    """The child processes and connections, shared with the finalizer (which must not hold the executor)."""

    def __init__(self) -> None:
        #: the ranks, or the launcher of this host's ranks
        self.processes: list[ChildProcess] = []
        #: the fork server of the ranks, if they were forked (shared: it outlives the ranks)
        self.servers: list[ChildProcess] = []
        self.conns: dict[int, Connection] = {}

    def kill(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
        kill_children(self.processes)


class DistributedExecutor:
    """Starts the ranks of one model replica and runs steps on them (see the module docstring)."""

    #: nothing to probe from here: a rank whose device broke reports it (`WorkerFailedError`)
    probe = None

    def __init__(
        self,
        config: EngineConfig,
        model_path: str,
        layout: ParallelLayout,
        placement: Placement,
        backend_class: type[Backend],
        max_model_len: int,
        max_num_batched_tokens: int,
    ) -> None:
        self.layout = layout
        self.placement = placement
        #: the ranks' backend class, for its capabilities (`copy_kv_blocks`)
        self.backend_class = backend_class
        self.block_size = config.block_size
        #: a replica's ranks take the devices, and the `workerlog.<index>` numbers, after those
        #: of the replicas before it (as one launcher numbers all of a host's workers)
        self.device_offset = config.data_parallel_rank * layout.world_size
        self.replica = config.data_parallel_rank
        self.timeout = config.dist_init_timeout
        self.phase = "while starting"
        self._failure: WorkerFailedError | None = None
        self._in_flight: deque[tuple[ScheduledBatch, list[int]]] = deque()
        self._children = _Children()
        self._finalizer = weakref.finalize(self, self._children.kill)
        self._authkey = _authkey(placement)
        self._spec = protocol.WorkerSpec(
            config, model_path, max_model_len, max_num_batched_tokens, layout, self.timeout
        )
        self._log_dir = os.path.abspath(envs.log_dir())
        os.makedirs(self._log_dir, exist_ok=True)
        self._listener: Listener | None = None
        self._accepted: queue.Queue[Connection] = queue.Queue()
        #: when the ranks were started, for the start-up times the log gives
        self._started = time.monotonic()
        self.address = f"{placement.master}:{placement.control_port}"
        if placement.is_master:
            self._listen()
        try:
            if placement.multi_host:
                self._start_launcher(backend_class)
            else:
                self._start_ranks(backend_class)
        except BaseException:
            self.shutdown()
            raise

    # --- starting ---------------------------------------------------------------------------
    def _listen(self) -> None:
        placement = self.placement
        if placement.multi_host:
            bind, port = "0.0.0.0", placement.control_port
        else:
            bind, port = "127.0.0.1", 0
        try:
            self._listener = Listener((bind, port), authkey=self._authkey, backlog=self.layout.world_size)
        except OSError as exc:
            raise DistributedInitError(
                f"the engine cannot listen for its ranks on {bind}:{port}: {exc} "
                "(choose another engine_worker_queue_port)"
            ) from exc
        if not placement.multi_host:
            self.address = f"127.0.0.1:{self._listener.address[1]}"
        threading.Thread(target=self._accept, name="fastdeploy-rank-accept", daemon=True).start()

    def _accept(self) -> None:
        listener = self._listener
        while listener is not None:
            try:
                self._accepted.put(listener.accept())
            except (OSError, EOFError):
                return  # closed by shutdown
            except Exception:  # a bad handshake (wrong authkey) must not stop the others
                logger.warning("refused a connection to the rank control port", exc_info=True)

    def _worker_args(self) -> list[str]:
        return ["--driver", self.address, "--timeout", str(self.timeout)]

    def _worker_command(self) -> list[str]:
        return [sys.executable, "-m", "fastdeploy.executor.worker", *self._worker_args()]

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[AUTHKEY_ENV] = self._authkey.hex()
        env[PARENT_ENV] = str(os.getpid())
        env["FD_LOG_DIR"] = self._log_dir
        return env

    def _start_ranks(self, backend_class: type[Backend]) -> None:
        """One host: the ranks are forked by a fork server (host backends), or are children of
        this process (device backends, whose ranks need their own environment before they import)."""
        world = self.layout.world_size
        master = f"127.0.0.1:{free_port()}"
        endpoints = [f"127.0.0.1:{free_port()}" for _ in range(world)]
        ranks_env = [backend_class.rank_environment(self.device_offset + rank) for rank in range(world)]
        server = None
        if uses_fork_server(backend_class):
            server = shared_server(
                backend_class.name,
                self.layout.distributed,
                server_environment(self._log_dir),
                self._log_dir,
                self._spec.model_path,
            )
            self._children.servers.append(server.child)
        for rank in range(world):
            env = self._base_env()
            env.update(rendezvous_environment(rank, world, master, endpoints, rank, world))
            env.update(ranks_env[rank])
            log = os.path.join(self._log_dir, f"workerlog.{self.device_offset + rank}")
            if server is not None:
                child = server.fork(
                    f"rank {rank}", [rank], self._worker_args(), env, log, self._spec.model_path
                )
            else:
                child = start_child(f"rank {rank}", [rank], self._worker_command(), env, log)
            self._children.processes.append(child)

    def _start_launcher(self, backend_class: type[Backend]) -> None:
        """Several hosts: this host's ranks come from paddle.distributed.launch, as on every host."""
        placement, layout = self.placement, self.layout
        per_host = placement.ranks_per_host(layout)
        command = [
            sys.executable,
            "-m",
            "fastdeploy.executor.worker",
            "exec",
            "--",
            *launcher_command(placement, per_host, self._log_dir, backend_class.device_count() is not None),
            os.path.join(os.path.dirname(__file__), "worker.py"),
            *self._worker_args(),
        ]
        ranks = list(placement.local_ranks(layout))
        log = os.path.join(self._log_dir, f"launch.{placement.node_rank}.log")
        child = start_child(
            f"paddle.distributed.launch of ranks {ranks[0]}-{ranks[-1]}",
            ranks,
            command,
            self._base_env(),
            log,
        )
        child.logs = {
            rank: os.path.join(self._log_dir, f"workerlog.{index}") for index, rank in enumerate(ranks)
        }
        self._children.processes.append(child)
        logger.info(
            "host %d of %s: started its ranks with %s",
            placement.node_rank,
            ",".join(placement.hosts),
            " ".join(command),
        )

    def wait_ready(self) -> int:
        """Block until every rank has loaded its shard and allocated its KV cache; the block count.

        Every rank offers the blocks its memory allows; all use the smallest offer, since block
        ids are shared.
        """
        self.phase = "while loading the model"
        self._connect_all()
        for conn in self._children.conns.values():
            conn.send(self._spec)
        offers = self._receive(set(range(self.layout.world_size)))
        num_blocks = min(message.num_blocks for message in offers.values())
        self._broadcast(protocol.AllocateKVCache(num_blocks))
        self._receive(set(range(self.layout.world_size)))
        self.phase = "during generation"
        logger.info(
            "%d ranks ready %.2f s after the start: %d KV blocks each (offers: %s)",
            len(offers),
            time.monotonic() - self._started,
            num_blocks,
            sorted(offers),
        )
        return num_blocks

    def _connect_all(self) -> None:
        world = self.layout.world_size
        deadline = time.monotonic() + self.timeout
        conns = self._children.conns
        while len(conns) < world:
            self._check_children()
            try:
                conn = self._accepted.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if time.monotonic() < deadline:
                    continue
                missing = sorted(set(range(world)) - set(conns))
                self._fail(
                    missing[0],
                    f"did not connect to the engine at {self.address} within {self.timeout:g} s"
                    + (
                        f" (ranks {missing} run on {', '.join(sorted({self.placement.host_of(r, self.layout) for r in missing}))}:"
                        " start fastdeploy with the same ips there)"
                        if self.placement.multi_host
                        else ""
                    ),
                )
            if not conn.poll(self.timeout):
                conn.close()
                continue
            hello = conn.recv()
            conns[hello.rank] = conn
            logger.info(
                "rank %d connected (pid %d on %s) %.2f s after the start",
                hello.rank,
                hello.pid,
                hello.host,
                time.monotonic() - self._started,
            )

    # --- steps ------------------------------------------------------------------------------
    def execute(self, batch: ScheduledBatch, feed: Callable[[BatchLayout], Any] | None = None) -> PassOutput:
        """Run one step on the ranks: (host logits or None, sampling indices, forward seconds).
        `feed` must be None: the ranks read their input ids from the layout (no async scheduling)."""
        if feed is not None:
            raise InvalidArgumentError("rank processes cannot take device input ids (async scheduling)")
        self.submit(batch)
        _, logits, sampling, seconds = self.collect()
        return logits, sampling, seconds

    def submit(self, batch: ScheduledBatch) -> None:
        """Send a step to every rank without waiting for it (pipeline parallelism keeps several in flight)."""
        layout, sampling = build_layout(batch, self.block_size)
        self._broadcast(protocol.Step(layout))
        self._in_flight.append((batch, sampling))

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def collect(self) -> tuple[ScheduledBatch, Any, list[int], float]:
        """Wait for the oldest submitted step: (its batch, host logits or None, sampling indices, seconds)."""
        batch, sampling = self._in_flight.popleft()
        output = self._receive({self.layout.output_rank})[self.layout.output_rank]
        return batch, output.logits, sampling, output.seconds

    # --- messages and failures ----------------------------------------------------------------
    def _broadcast(self, message: Any) -> None:
        self._raise_if_failed()
        data = bytes(ForkingPickler.dumps(message))
        for rank, conn in self._children.conns.items():
            try:
                conn.send_bytes(data)
            except OSError:
                self._fail(rank, "closed its connection to the engine")

    def _receive(self, expected: set[int]) -> dict[int, Any]:
        """One message from each rank in `expected`, failing on any rank's death or error."""
        self._raise_if_failed()
        received: dict[int, Any] = {}
        while len(received) < len(expected):
            by_conn = {conn: rank for rank, conn in self._children.conns.items()}
            by_sentinel = {c.sentinel: c for c in self._children.processes if c.sentinel is not None}
            for ready in wait([*by_conn, *by_sentinel], timeout=_POLL_SECONDS):
                if ready in by_sentinel:
                    child = by_sentinel[ready]
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.process.wait(timeout=2.0)  # a fork server reports the status a moment later
                    self._fail(child.ranks[0], child.how_it_ended(), child=child)
                rank = by_conn[ready]
                message = self._read(ready, rank)
                if rank not in expected or rank in received:
                    self._fail(rank, f"sent an unexpected {type(message).__name__}")
                received[rank] = message
            self._check_children()
        return received

    def _read(self, conn: Connection, rank: int) -> Any:
        """The next message of `rank`; a closed connection or a `Failure` fails the executor."""
        try:
            message = conn.recv()
        except (EOFError, OSError):
            self._fail(rank, "closed its connection to the engine")
        if isinstance(message, protocol.Failure):
            killed = self._killed_child(rank, _CAUSE_GRACE)
            if killed is not None:
                self._fail(killed.ranks[0], killed.how_it_ended(), child=killed)
            self._fail(rank, "raised an error", detail=message.message)
        return message

    def _killed_child(self, rank: int, within: float) -> ChildProcess | None:
        """Another rank's process that a signal killed (so it could not report), waiting up to
        `within` seconds for one: the cause of `rank`'s error rather than `rank`."""
        others = [child for child in self._children.processes if rank not in child.ranks]
        deadline = time.monotonic() + within
        while True:
            killed = next((child for child in others if (child.process.poll() or 0) < 0), None)
            remaining = deadline - time.monotonic()
            if killed is not None or remaining <= 0:
                return killed
            running = [child for child in others if not child.exited()]
            sentinels = [child.sentinel for child in running if child.sentinel is not None]
            if sentinels:
                wait(sentinels, timeout=min(remaining, _POLL_SECONDS))
            else:
                time.sleep(min(remaining, 0.02))

    def check_health(self) -> None:
        """Raise WorkerFailedError if a rank has died or failed; between steps only (no message
        is expected then, so anything readable is a failure report or a closed connection)."""
        self._raise_if_failed()
        if self._in_flight or self.phase != "during generation":
            return
        self._check_children()
        by_conn = {conn: rank for rank, conn in self._children.conns.items()}
        for ready in wait(list(by_conn), timeout=0):
            message = self._read(ready, by_conn[ready])
            self._fail(by_conn[ready], f"sent an unexpected {type(message).__name__}")

    def _check_children(self) -> None:
        for child in self._children.processes:
            if child.exited():
                self._fail(child.ranks[0], child.how_it_ended(), child=child)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _child_of(self, rank: int) -> ChildProcess | None:
        return next((c for c in self._children.processes if rank in c.ranks), None)

    def _fail(
        self, rank: int, how: str, detail: str | None = None, child: ChildProcess | None = None
    ) -> None:
        """Raise (and remember) WorkerFailedError for `rank` after killing every rank."""
        child = child or self._child_of(rank)
        if child is not None and how.startswith("closed its connection"):
            # a process that died closes its socket first: say how it ended once the kernel knows
            deadline = time.monotonic() + 2.0
            while not child.exited() and time.monotonic() < deadline:
                time.sleep(0.01)
            if child.exited():
                how = child.how_it_ended()
        label = child.label if child is not None and len(child.ranks) > 1 else None
        parts = [rank_name(rank, self.replica) + (f" ({label})" if label else "") + f" {how} {self.phase}"]
        if detail:
            parts.append(f"its error:\n{detail.rstrip()}")
        log = child.logs.get(rank) if child is not None else None
        lines = tail(log) if log else ""
        if lines:
            parts.append(f"last lines of {log}:\n{lines}")
        elif child is None and self.placement.multi_host:
            host = self.placement.host_of(rank, self.layout)
            parts.append(f"its log is {self._log_dir}/workerlog.* on {host}")
        self._failure = WorkerFailedError("; ".join(parts))
        logger.error("%s", self._failure)
        self._children.kill()
        raise self._failure

    # --- stopping ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Ask the ranks to exit, give them a few seconds, then kill what is left."""
        for conn in self._children.conns.values():
            with contextlib.suppress(OSError):
                conn.send(protocol.Shutdown())
        stop_children(self._children.processes, _SHUTDOWN_GRACE)
        self._children.kill()
        if self._listener is not None:
            listener, self._listener = self._listener, None
            listener.close()
        self._finalizer.detach()

    def wait_for_launcher(self) -> int:
        """On a host other than the master: wait until this host's ranks exit; their launcher's status."""
        codes = [child.process.wait() for child in self._children.processes]
        return max(codes, default=0)


def launcher_command(placement: Placement, per_host: int, log_dir: str, with_devices: bool) -> list[str]:
    """paddle.distributed.launch for this host's ranks (no restarts: a failed rank fails the run)."""
    command = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--master",
        f"{placement.master}:{placement.control_port + 1}",
        "--nnodes",
        str(len(placement.hosts)),
        "--rank",
        str(placement.node_rank),
        "--nproc_per_node",
        str(per_host),
        "--log_dir",
        log_dir,
        "--max_restart",
        "0",
        "--job_id",
        "fastdeploy",
    ]
    if with_devices:
        command += ["--devices", ",".join(str(i) for i in range(per_host))]
    return command
