"""A rank process: loads its shard of the model and runs the forward passes the engine sends.

Started as `python -m fastdeploy.executor.worker --driver HOST:PORT`, either by the engine
(one host) or by `paddle.distributed.launch` (several hosts); the rendezvous variables of
`fastdeploy.parallel.rendezvous` say which rank it is. It connects to the engine, receives a
`WorkerSpec`, builds the backend, the communicator and its model shard, sizes its own KV cache,
and then runs `Step`s until `Shutdown` or until the engine goes away. Every rank runs the same
model code through the backend ops; only the output rank sends logits back.

`python -m fastdeploy.executor.worker exec -- COMMAND...` runs COMMAND (the launcher of a
multi-host run) so that it dies with the engine.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Client, Connection

from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.selection import build_backend_of, select_backend_class
from fastdeploy.executor import protocol
from fastdeploy.executor.protocol import AUTHKEY_ENV, PARENT_ENV
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.kv_cache_planner import plan_kv_cache
from fastdeploy.model_executor.model_loader import (
    build_model,
    check_backend_kv_cache_dtype,
    check_backend_quantization,
    check_model_quantization,
    inspect_checkpoint,
)
from fastdeploy.model_executor.model_runner import ModelRunner
from fastdeploy.parallel.model_parallel import ModelParallel
from fastdeploy.parallel.rendezvous import rendezvous_from_environment
from fastdeploy.parallel.selection import communicator_class, create_communicator
from fastdeploy.parallel.topology import rank_name
from fastdeploy.plugins.registry import get_registry


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent exits (Linux), so no rank outlives the
    engine even when the engine itself is killed; exit now if the parent is already gone."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)
    expected = os.environ.get(PARENT_ENV)
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)


def connect(address: str, authkey: bytes, timeout: float) -> Connection:
    """The control connection to the engine, retried until `timeout` seconds have passed."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            return Client((host, int(port)), authkey=authkey)
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise SystemExit(f"cannot reach the engine at {address} within {timeout:g} s: {exc}") from exc
            time.sleep(0.05)


def preload(backend: str, collectives: bool, model_path: str | None = None) -> None:
    """Import what a rank of `backend` (a registered name) runs beyond this module's own imports:
    the plugins, the backend's module and, with `collectives`, its collectives runtime; and read the
    configuration of `model_path`, if given (a loader keeps what it parses: a GGUF header,
    ~0.1 s), and what its loader reads tensors with. A fork server does this once for all its
    ranks."""
    registry = get_registry()
    backend_class = select_backend_class(backend, registry)
    if collectives:
        communicator_class(backend_class, registry).preload()
    if model_path is not None:
        inspect_checkpoint(model_path, registry).loader.preload()


class Worker:
    """One rank's backend, model shard, KV cache and runner."""

    def __init__(self, spec: protocol.WorkerSpec, conn: Connection) -> None:
        laps = _Laps()
        self.spec = spec
        self.conn = conn
        config = spec.config
        registry = get_registry()
        laps.lap("registry")
        rendezvous = rendezvous_from_environment(spec.rendezvous_timeout)
        self.rank = rendezvous.rank
        backend_class = select_backend_class(config.device, registry)
        # on a host backend the host's ranks share its cores and memory; on a device backend
        # each rank has a device of its own
        sharing = int(os.environ.get("PADDLE_LOCAL_SIZE", "1")) if backend_class.device_count() is None else 1
        threads = config.cpu_threads or max(1, BackendOptions().thread_count() // sharing)
        self.backend = build_backend_of(backend_class, BackendOptions(threads=threads, dtype=config.dtype))
        check_backend_quantization(config.quantization, self.backend)
        check_backend_kv_cache_dtype(config, self.backend)
        laps.lap("backend")
        self.parallel = ModelParallel(spec.layout, self.rank)
        communicator = communicator_class(backend_class, registry) if spec.layout.distributed else None
        # the shard loads while the communicator's runtime imports
        importing = _Background(communicator.preload) if communicator is not None else None
        checkpoint = inspect_checkpoint(spec.model_path, registry)
        check_model_quantization(
            config.quantization, config.quantization_group_size, checkpoint, backend_class
        )
        self.model = build_model(
            checkpoint,
            self.backend,
            spec.max_model_len,
            registry,
            self.parallel,
            config.quantization,
            config.quantization_group_size,
        )
        laps.lap("shard")
        if communicator is not None:
            importing.result()
            laps.lap(f"{communicator.name} import")
            self.parallel.connect(create_communicator(self.backend, rendezvous, registry))
            laps.lap("group join")
        self.kv_spec = plan_kv_cache(
            config,
            self.backend,
            spec.max_model_len,
            self.model,
            spec.max_num_batched_tokens,
            memory_share=1.0 / sharing,
        )
        laps.lap("KV plan")
        get_logger(__name__).info("%s loaded in %s", rank_name(self.rank, config.data_parallel_rank), laps)

    def serve(self) -> None:
        conn = self.conn
        conn.send(protocol.Loaded(self.rank, self.kv_spec.num_blocks))
        allocate = conn.recv()
        kv_spec = dataclasses.replace(self.kv_spec, num_blocks=allocate.num_blocks)
        runner = ModelRunner(
            self.model, self.backend, self.backend.allocate_kv_cache(kv_spec), kv_spec.block_size
        )
        conn.send(protocol.Loaded(self.rank, kv_spec.num_blocks))
        reports = self.rank == self.spec.layout.output_rank
        while True:
            message = conn.recv()
            if isinstance(message, protocol.Shutdown):
                return
            start = time.perf_counter()
            logits = runner.run(message.layout)
            if reports:
                host = None if logits is None else self.backend.to_numpy(logits)
                conn.send(protocol.StepOutput(host, time.perf_counter() - start))


class _Laps:
    """Seconds of each start-up phase of a rank, for its log (where a slow start-up went)."""

    def __init__(self) -> None:
        self._start = self._last = time.perf_counter()
        self._cpu = time.process_time()
        self._laps: list[tuple[str, float]] = []

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self._laps.append((name, now - self._last))
        self._last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in self._laps)
        cpu = time.process_time() - self._cpu  # below the wall time where others had the cores
        return f"{self._last - self._start:.2f} s ({parts}; {cpu:.2f} s of CPU)"


class _Background:
    """Runs a function on a thread; `result()` waits and re-raises what it raised."""

    def __init__(self, function: Callable[[], None]) -> None:
        self._error: BaseException | None = None

        def run() -> None:
            try:
                function()
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=run, name="fastdeploy-preload", daemon=True)
        self._thread.start()

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def _run_rank(driver: str, timeout: float) -> int:
    authkey = bytes.fromhex(os.environ[AUTHKEY_ENV])
    conn = connect(driver, authkey, timeout)
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    conn.send(protocol.Hello(rank, os.getpid(), socket.gethostname()))
    try:
        spec = conn.recv()
        Worker(spec, conn).serve()
    except (EOFError, ConnectionError):
        return 0  # the engine went away: nothing left to serve
    except BaseException:
        message = traceback.format_exc()
        sys.stderr.write(message)
        sys.stderr.flush()
        with contextlib.suppress(OSError):
            conn.send(protocol.Failure(rank, message))
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    if argv[:1] == ["exec"]:
        command = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        os.environ.pop(PARENT_ENV, None)  # the launcher's children have the launcher as parent
        os.execvp(command[0], command)
    parser = argparse.ArgumentParser(prog="python -m fastdeploy.executor.worker")
    parser.add_argument("--driver", required=True, help="HOST:PORT of the engine's control listener")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to reach the engine")
    args = parser.parse_args(argv)
    return _run_rank(args.driver, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
