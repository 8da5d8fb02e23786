"""Two replicas behind `fastdeploy router` against one replica, each replica on a core of its own.

Issue 31's goal is >= 1.8x one replica's throughput from 2 replicas on 2 hosts "when each host
has its own cores". Here each replica is a real `fastdeploy serve` of the embedded model pinned
to one core (`taskset`, one kernel thread), standing for a host; the router and this client run
unpinned and need little CPU (they relay bytes while the engines decode). The same closed-loop
load (`--clients` concurrent clients per replica, each sending completions of `--max-tokens`
tokens with EOS ignored) goes to one replica directly, then to two replicas through the router,
and the script prints the generated tokens per second of each and their ratio.

    python benchmarks/router_scaling.py [--requests-per-replica 24] [--clients 4] [--max-tokens 64]

On a 2-core machine the router and the client share the replicas' cores, so the ratio is a floor
for hosts that each have their own; a busy machine lowers it further (the load average is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import httpx
from router import HOST, Process, free_port

PROMPTS = [
    f"Write a short story about a {thing} who learns to sing." for thing in ("cat", "robot", "river", "lamp")
]


def serve(core: int) -> Process:
    """The embedded model on one core: one kernel thread, pinned."""
    port = free_port()
    command = ["taskset", "-c", str(core), sys.executable, "-m", "fastdeploy", "serve"]
    command += ["--host", HOST, "--port", str(port), "--cpu-threads", "1", "--max-num-seqs", "8"]
    return Process([*command, "--uvicorn-log-level", "warning"], port)


def start_router(workers: list[str]) -> Process:
    port = free_port()
    command = [sys.executable, "-m", "fastdeploy", "router", "--host", HOST, "--port", str(port)]
    command += ["--workers", ",".join(workers), "--uvicorn-log-level", "warning"]
    return Process(command, port)


async def closed_loop(url: str, clients: int, requests: int, max_tokens: int) -> tuple[float, int]:
    """`clients` loops sending `requests` completions in all; (seconds, generated tokens)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(requests):
        queue.put_nowait(index)
    tokens = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while not queue.empty():
            index = queue.get_nowait()
            body = {"prompt": PROMPTS[index % len(PROMPTS)], "max_tokens": max_tokens, "ignore_eos": True}
            response = await http.post(url + "/v1/completions", json=body)
            response.raise_for_status()
            tokens += response.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients)) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests-per-replica", type=int, default=24)
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients per replica")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 cores: one per replica")
    started: list[Process] = []
    try:
        replicas = [serve(0), serve(1)]
        started += replicas
        router = start_router([replica.url for replica in replicas])
        started.append(router)
        runs = {}
        for name, url, count in (
            ("1 replica, direct", replicas[0].url, 1),
            ("2 replicas, router", router.url, 2),
        ):
            asyncio.run(closed_loop(url, args.clients * count, 2 * count, 8))  # warm-up
            load = os.getloadavg()[0]
            seconds, tokens = asyncio.run(
                closed_loop(url, args.clients * count, args.requests_per_replica * count, args.max_tokens)
            )
            runs[name] = tokens / seconds
            print(
                f"{name:20s} {tokens:6d} tokens in {seconds:6.1f} s = {tokens / seconds:7.1f} tok/s (load {load:.1f})"
            )
        one, two = runs.values()
        print(f"2 replicas / 1 replica: {two / one:.2f}x (goal >= 1.8x)")
    finally:
        for process in reversed(started):
            process.stop()


if __name__ == "__main__":
    main()
