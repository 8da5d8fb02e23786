"""What `fastdeploy router` adds: latency per request, and the timing of a stream's chunks.

A worker that answers at once (a stand-in started by this script, so the worker's own time does
not drown the router's) is asked directly and through a router, alternately, with many small
requests on one kept-alive connection each; the script prints the median and p90 latency of
both and what the router adds. It then streams a fixed number of chunks spaced by a fixed gap,
directly and through the router, and prints the gaps between chunks as the client saw them: a
router that buffered would merge chunks (gaps near 0 and 2x) instead of keeping the worker's gap.

With `--real`, the same requests go to a real `fastdeploy serve` worker (the embedded model,
`max_tokens` 1 for the latency part, its own token stream for the chunk part) as well.

    python benchmarks/router.py [--requests 500] [--chunks 50] [--gap-ms 20] [--real]

Two replicas giving >= 1.8x one replica's throughput needs a machine with cores to spare for two
engines; on a 2-core machine the two engines share the same cores, so only the router's own
overhead is measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def terminate_with_parent() -> None:
    """In the child before exec: the kernel sends it SIGTERM when the benchmark exits (Linux), so a
    benchmark killed with SIGKILL, which runs no cleanup, leaves no server behind (the server's
    SIGTERM handling stops its own workers)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


class Process:
    """A server subprocess on a loopback port, ready once its /health answers 200."""

    def __init__(self, command: list[str], port: int, timeout: float = 300) -> None:
        self.url = f"http://{HOST}:{port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - the server's log, read if it fails
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=terminate_with_parent,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"{command} exited:\n{self.log.read().decode(errors='replace')}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{command} did not become healthy in {timeout} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def serve_standin(port: int) -> None:
    """The instant worker: /health, a one-line completion, and a stream of `chunks` chunks spaced
    by `gap_ms` (both read from the request)."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        if not body.get("stream"):
            return {
                "object": "text_completion",
                "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
            }

        async def events():
            for index in range(body["chunks"]):
                if index:
                    await asyncio.sleep(body["gap_ms"] / 1000)
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': str(index)}]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    """The machine's load: other processes competing for the cores widen every figure here."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def latencies(urls: dict[str, str], requests: int, payload: dict) -> dict[str, list[float]]:
    """Per target, the seconds of `requests` requests, the targets taking turns."""
    clients = {name: httpx.Client(base_url=url, timeout=120) for name, url in urls.items()}
    times: dict[str, list[float]] = {name: [] for name in urls}
    try:
        for client in clients.values():  # warm the connections
            client.post("/v1/completions", json=payload).raise_for_status()
        for _ in range(requests):
            for name, client in clients.items():
                start = time.perf_counter()
                client.post("/v1/completions", json=payload).raise_for_status()
                times[name].append(time.perf_counter() - start)
    finally:
        for client in clients.values():
            client.close()
    return times


def chunk_gaps(url: str, payload: dict) -> tuple[float, list[float]]:
    """Seconds to the first chunk, and between each chunk and the next, as the client saw them."""
    arrivals = []
    with httpx.Client(base_url=url, timeout=120) as client:
        start = time.perf_counter()
        with client.stream("POST", "/v1/completions", json={**payload, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    arrivals.append(time.perf_counter())
    return arrivals[0] - start, [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]


def report_latency(title: str, times: dict[str, list[float]], router_cpu: float) -> None:
    direct, routed = percentiles(times["direct"]), percentiles(times["router"])
    print(f"\n{title}: {len(times['direct'])} requests each, one at a time")
    print(f"  router CPU time per request: {router_cpu / len(times['router']) * 1e3:.3f} ms")
    print(f"  {'':8} {'median ms':>10} {'p90 ms':>10}")
    print(f"  {'direct':8} {direct[0] * 1e3:10.3f} {direct[1] * 1e3:10.3f}")
    print(f"  {'router':8} {routed[0] * 1e3:10.3f} {routed[1] * 1e3:10.3f}")
    print(f"  {'added':8} {(routed[0] - direct[0]) * 1e3:10.3f} {(routed[1] - direct[1]) * 1e3:10.3f}")


def report_gaps(title: str, direct: tuple[float, list[float]], routed: tuple[float, list[float]]) -> None:
    print(f"\n{title}: gaps between chunks as the client saw them")
    print(
        f"  {'':8} {'first ms':>9} {'median ms':>10} {'p90 ms':>8} {'min ms':>8} {'max ms':>8} {'chunks':>7}"
    )
    for name, (first, gaps) in (("direct", direct), ("router", routed)):
        median, p90 = percentiles(gaps)
        print(
            f"  {name:8} {first * 1e3:9.2f} {median * 1e3:10.2f} {p90 * 1e3:8.2f} "
            f"{min(gaps) * 1e3:8.2f} {max(gaps) * 1e3:8.2f} {len(gaps) + 1:7d}"
        )


def start_router(worker: str) -> Process:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "fastdeploy",
        "router",
        "--workers",
        worker,
        "--host",
        HOST,
        "--port",
        str(port),
    ]
    return Process([*command, "--uvicorn-log-level", "warning"], port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="small requests per target (default 500)")
    parser.add_argument("--chunks", type=int, default=50, help="chunks in the timed stream (default 50)")
    parser.add_argument(
        "--gap-ms", type=float, default=20.0, help="the stand-in's gap between chunks (default 20)"
    )
    parser.add_argument(
        "--real", action="store_true", help="also measure with a real fastdeploy serve worker"
    )
    parser.add_argument("--serve-standin", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_standin:
        serve_standin(args.serve_standin)
        return

    print(f"cpus: {os.cpu_count()}; two replicas vs one is not measured here (see the module docstring)")
    print(f"load average at the start (1, 5, 15 min): {load_average()}")
    port = free_port()
    standin = Process([sys.executable, os.path.abspath(__file__), "--serve-standin", str(port)], port)
    router = start_router(standin.url)
    try:
        urls = {"direct": standin.url, "router": router.url}
        cpu = cpu_seconds(router.process.pid)
        times = latencies(urls, args.requests, {"prompt": "x", "max_tokens": 1})
        report_latency("instant worker", times, cpu_seconds(router.process.pid) - cpu)
        stream = {"prompt": "x", "chunks": args.chunks, "gap_ms": args.gap_ms}
        report_gaps(
            f"instant worker, {args.chunks} chunks {args.gap_ms:g} ms apart",
            chunk_gaps(standin.url, stream),
            chunk_gaps(router.url, stream),
        )
    finally:
        router.stop()
        standin.stop()
    print(f"\nload average at the end (1, 5, 15 min): {load_average()}")
    if args.real:
        measure_real_worker(args)


def measure_real_worker(args: argparse.Namespace) -> None:
    port = free_port()
    worker = Process([sys.executable, "-m", "fastdeploy", "serve", "--port", str(port), "--host", HOST], port)
    router = start_router(worker.url)
    try:
        model = httpx.get(worker.url + "/v1/models").json()["data"][0]["id"]
        small = {"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
        urls = {"direct": worker.url, "router": router.url}
        cpu = cpu_seconds(router.process.pid)
        times = latencies(urls, max(args.requests // 5, 20), small)
        report_latency("fastdeploy serve worker, max_tokens 1", times, cpu_seconds(router.process.pid) - cpu)
        stream = {"model": model, "prompt": "Once upon a time", "max_tokens": args.chunks, "temperature": 0}
        stream["ignore_eos"] = True
        report_gaps(
            f"fastdeploy serve worker, {args.chunks} tokens",
            chunk_gaps(worker.url, stream),
            chunk_gaps(router.url, stream),
        )
    finally:
        router.stop()
        worker.stop()


if __name__ == "__main__":
    main()
