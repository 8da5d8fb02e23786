"""Messages between the engine (driver) and its rank processes, over one connection per rank.

The connection is a `multiprocessing.connection` socket with an HMAC handshake on `authkey`;
messages are pickled dataclasses. Order of a run:

    rank -> driver   Hello            who it is (also when started by another host's launcher)
    driver -> rank   WorkerSpec       what to load and how to reach the other ranks
    rank -> driver   Loaded           its shard is loaded; how many KV blocks it can hold
    driver -> rank   AllocateKVCache  the block count every rank uses (the smallest offered)
    rank -> driver   Loaded           the cache is allocated
    driver -> rank   Step ...         one per forward pass; the output rank answers StepOutput
    driver -> rank   Shutdown

A rank that fails sends `Failure` with its traceback when it still can.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastdeploy.backends.base import BatchLayout
from fastdeploy.config import EngineConfig
from fastdeploy.parallel.topology import ParallelLayout

#: env variable carrying the hex HMAC key of the engine's control connection
AUTHKEY_ENV = "FD_DIST_AUTHKEY"
#: env variable carrying the pid the process must not outlive
PARENT_ENV = "FD_DIST_PARENT_PID"


@dataclass(frozen=True)
class Hello:
    rank: int
    pid: int
    host: str


@dataclass(frozen=True)
class WorkerSpec:
    config: EngineConfig
    model_path: str
    max_model_len: int
    max_num_batched_tokens: int
    layout: ParallelLayout
    #: seconds to reach the other ranks before giving up
    rendezvous_timeout: float


@dataclass(frozen=True)
class Loaded:
    rank: int
    num_blocks: int


@dataclass(frozen=True)
class AllocateKVCache:
    num_blocks: int


@dataclass(frozen=True)
class Step:
    """One forward pass: the host batch layout (and whatever else the runner's inputs carry)."""

    layout: BatchLayout


@dataclass(frozen=True)
class StepOutput:
    logits: np.ndarray | None
    seconds: float


@dataclass(frozen=True)
class Failure:
    rank: int
    message: str


@dataclass(frozen=True)
class Shutdown:
    pass
