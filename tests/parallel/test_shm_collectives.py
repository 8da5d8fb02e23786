"""The shared-memory collectives of one host's ranks: every rank gets the sum, bit for bit what
numpy computes adding the ranks' arrays in rank order, and the rank-order concatenation of an
all-gather, over many calls (both generations of the segment), vectors longer than a slot
(chunks), and no file left in /dev/shm."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from fastdeploy.parallel import shm_collectives
from fastdeploy.parallel.shm_collectives import SharedMemoryCollectives

pytestmark = pytest.mark.skipif(
    not SharedMemoryCollectives.usable(), reason="needs the native kernels and /dev/shm (Linux)"
)

LENGTHS = [1, 576, 3000, 2 * 1024 + 5]  # the last is over the test's slot of 1024 floats: 3 chunks


def arrays(rank: int, call: int, length: int) -> np.ndarray:
    return np.random.default_rng([rank, call, length]).standard_normal(length).astype(np.float32)


def voting(rank: int, size: int, barrier, votes):
    """An `all_agree` over processes: every rank's vote, then whether all were True."""

    def all_agree(ok: bool) -> bool:
        votes[rank] = int(ok)
        barrier.wait(30)
        agreed = sum(votes[:size]) == size
        barrier.wait(30)
        return agreed

    return all_agree


def run_rank(rank: int, size: int, name: bytes, barrier, votes, results) -> None:
    shm_collectives.SLOT_FLOATS = 1024
    reducer = SharedMemoryCollectives(
        rank, size, lambda _: name, voting(rank, size, barrier, votes), timeout=30
    )
    sums = []
    for call in range(6):
        for length in LENGTHS:
            sums.append(reducer.all_reduce(arrays(rank, call, length)).tobytes())
            rows = arrays(rank, call, 2 * length).reshape(2, length)
            sums.append(reducer.all_gather(rows).tobytes())
    results.put((rank, sums))


@pytest.mark.parametrize("size", [2, 3])
def test_every_rank_gets_the_rank_order_sum_and_concatenation(size):
    context = multiprocessing.get_context("fork")
    barrier, votes, results = context.Barrier(size), context.Array("i", size), context.Queue()
    name = os.urandom(16).hex().encode()
    ranks = [
        context.Process(target=run_rank, args=(r, size, name, barrier, votes, results)) for r in range(size)
    ]
    for process in ranks:
        process.start()
    got = dict(results.get(timeout=60) for _ in ranks)
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    expected = []
    for call in range(6):
        for length in LENGTHS:
            total = arrays(0, call, length)
            for rank in range(1, size):
                total = total + arrays(rank, call, length)
            expected.append(total.tobytes())
            parts = [arrays(rank, call, 2 * length).reshape(2, length) for rank in range(size)]
            expected.append(np.concatenate(parts, axis=-1).tobytes())
    for rank in range(size):
        assert got[rank] == expected, f"rank {rank}"
    assert not [f for f in os.listdir(shm_collectives.SHM_DIRECTORY) if name.decode() in f]


def test_when_one_rank_cannot_map_the_segment_every_rank_keeps_to_the_framework():
    context = multiprocessing.get_context("fork")
    barrier, votes, outcome = context.Barrier(2), context.Array("i", 2), context.Queue()
    name = os.urandom(16).hex().encode()

    def blind_peer() -> None:  # its /dev/shm is not the others' (a container of its own, say)
        def refuse(path, nbytes):
            raise FileNotFoundError(path)

        shm_collectives._map = refuse
        try:
            SharedMemoryCollectives(1, 2, lambda _: name, voting(1, 2, barrier, votes), timeout=30)
        except OSError as exc:
            outcome.put(str(exc))

    peer = context.Process(target=blind_peer)
    peer.start()
    with pytest.raises(OSError, match="not every rank of the group could map"):
        SharedMemoryCollectives(0, 2, lambda _: name, voting(0, 2, barrier, votes), timeout=30)
    assert "not every rank of the group could map" in outcome.get(timeout=30)
    peer.join(30)
    assert not [f for f in os.listdir(shm_collectives.SHM_DIRECTORY) if name.decode() in f]


def test_a_rank_whose_peer_never_comes_times_out():
    context = multiprocessing.get_context("fork")
    barrier, votes = context.Barrier(2), context.Array("i", 2)
    name = os.urandom(16).hex().encode()

    def absent_peer() -> None:  # maps the segment, then never all-reduces
        SharedMemoryCollectives(1, 2, lambda _: name, voting(1, 2, barrier, votes), timeout=30)

    peer = context.Process(target=absent_peer)
    peer.start()
    reducer = SharedMemoryCollectives(0, 2, lambda _: name, voting(0, 2, barrier, votes), timeout=0.2)
    peer.join(30)
    with pytest.raises(
        TimeoutError, match="shm_collective: rank 0 waited 200 ms for the other ranks of its group"
    ):
        reducer.all_reduce(np.ones(8, np.float32))
