"""Soak test: mixed traffic against `fastdeploy serve` for a long time, watching for leaks and creep.

Starts a server (the embedded SmolLM2 with the qwen3 reasoning parser and a 256 MiB KV cache,
~90 blocks, which long prompts overflow into preemption, unless told otherwise), or targets a
running one with `--url` (then `--pid` gives its process for RSS). The KV cache's pages are
committed as blocks are first used, so the start snapshot follows a warm-up that uses them all. `--concurrency`
clients loop over a seeded random mix of requests:

  short       a completion of 16 tokens
  long        a completion of a ~600-token prompt
  stream      a streamed chat answer, read to the end
  disconnect  a streamed completion the client drops after 3 events
  reasoning   a chat answer with thinking on or off and reasoning_max_tokens, streamed or not
  bad         a malformed request (bad field, bad JSON, wrong Content-Type, max_tokens too large)

It prints requests served, outcomes by kind (HTTP status and error code, or the client-side
exception), the server's RSS and KV-cache usage at start (after a warm-up) and end (after the
traffic drained), their drift, and p50 / p99 latency of the successful requests per window.
Goals: RSS drift under 5%, KV usage back to idle, no latency creep between windows.

    python benchmarks/soak.py --duration 1200 [--window 300] [--concurrency 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from fastdeploy.entrypoints.openai.benchmark import percentile

MODEL = "SmolLM2-135M-Instruct"
SCENARIOS = ("short", "long", "stream", "disconnect", "reasoning", "bad")
#: relative frequency of each scenario
WEIGHTS = (4, 1, 3, 2, 2, 2)
TOPICS = ["the sea", "a cat", "Paris", "music", "bread", "winter", "trains", "the moon", "rivers", "clocks"]


@dataclass
class Sample:
    """One finished request."""

    end: float
    scenario: str
    outcome: str
    seconds: float


@dataclass
class RssMark:
    """The server's resident set size `at` seconds into the traffic."""

    at: float
    rss_bytes: int


@dataclass
class Snapshot:
    rss_bytes: int
    kv_usage: float
    free_blocks: float
    total_blocks: float


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` (Linux /proc)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise RuntimeError(f"metric {name} missing from /metrics")


async def snapshot(client: httpx.AsyncClient, pid: int) -> Snapshot:
    text = (await client.get("/metrics")).text
    return Snapshot(
        rss_bytes(pid),
        metric(text, "fastdeploy:gpu_cache_usage_perc"),
        metric(text, "fastdeploy:available_gpu_block_num"),
        metric(text, "fastdeploy:gpu_total_block_num"),
    )


def request_for(scenario: str, rng: random.Random) -> tuple[str, dict[str, Any] | bytes, dict[str, str]]:
    """(path, JSON payload or raw body, extra headers) of one request of `scenario`."""
    topic = rng.choice(TOPICS)
    chat = [{"role": "user", "content": f"Write two sentences about {topic}."}]
    if scenario == "short":
        return "/v1/completions", {"model": MODEL, "prompt": f"A fact about {topic}:", "max_tokens": 16}, {}
    if scenario == "long":
        words = " ".join(rng.choice(TOPICS) for _ in range(200))
        return "/v1/completions", {"model": MODEL, "prompt": f"Summarise: {words}", "max_tokens": 16}, {}
    if scenario == "stream":
        return (
            "/v1/chat/completions",
            {"model": MODEL, "messages": chat, "max_tokens": 32, "stream": True},
            {},
        )
    if scenario == "disconnect":
        payload = {"model": MODEL, "prompt": f"A story about {topic}:", "max_tokens": 200, "ignore_eos": True}
        payload["stream"] = True
        return "/v1/completions", payload, {}
    if scenario == "reasoning":
        payload = {
            "model": MODEL,
            "messages": chat,
            "max_tokens": 32,
            "reasoning_max_tokens": 8,
            "chat_template_kwargs": {"enable_thinking": rng.random() < 0.5},
            "stream": rng.random() < 0.5,
        }
        return "/v1/chat/completions", payload, {}
    kind = rng.randrange(4)
    if kind == 0:
        return "/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, {}
    if kind == 1:
        return "/v1/completions", b'{"prompt": ', {"Content-Type": "application/json"}
    if kind == 2:
        return "/v1/completions", json.dumps({"prompt": "x"}).encode(), {"Content-Type": "text/plain"}
    return "/v1/chat/completions", {"model": MODEL, "messages": chat, "max_tokens": 10**9}, {}


def error_outcome(status: int, body: bytes) -> str:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return f"{status}:{code}" if code else str(status)


async def one_request(client: httpx.AsyncClient, scenario: str, rng: random.Random) -> str:
    """Send one request; its outcome ("ok", "<status>[:<code>]", "client_disconnected", ...)."""
    path, payload, headers = request_for(scenario, rng)
    options: dict[str, Any] = {"headers": headers}
    if isinstance(payload, bytes):
        options["content"] = payload
    else:
        options["json"] = payload
    streaming = isinstance(payload, dict) and payload.get("stream")
    if not streaming:
        response = await client.post(path, **options)
        return "ok" if response.status_code == 200 else error_outcome(response.status_code, response.content)
    async with client.stream("POST", path, **options) as response:
        if response.status_code != 200:
            return error_outcome(response.status_code, await response.aread())
        events = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events += 1
            if scenario == "disconnect" and events == 3:
                return "client_disconnected"  # leaving the block closes the connection
            if line != "data: [DONE]" and '"error"' in line:
                return "stream_error:" + str(json.loads(line[6:])["error"].get("code"))
        return "ok"


async def client_loop(samples: list[Sample], client: httpx.AsyncClient, seed: int, deadline: float) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        scenario = rng.choices(SCENARIOS, WEIGHTS)[0]
        started = time.monotonic()
        try:
            outcome = await one_request(client, scenario, rng)
        except httpx.HTTPError as exc:
            outcome = "client:" + type(exc).__name__
        samples.append(Sample(time.monotonic(), scenario, outcome, time.monotonic() - started))


async def wait_idle(client: httpx.AsyncClient, timeout: float = 300.0) -> None:
    """Wait until the server reports no running or waiting request."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = (await client.get("/metrics")).text
        busy = metric(text, "fastdeploy:num_requests_running") + metric(
            text, "fastdeploy:num_requests_waiting"
        )
        if busy == 0:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the server still had requests {timeout:.0f} s after the traffic stopped")


async def soak(url: str, pid: int, options: argparse.Namespace) -> dict[str, Any]:
    """Warm up, snapshot, run the traffic for `options.duration` seconds, drain, snapshot."""
    limits = httpx.Limits(max_connections=options.concurrency + 2)
    concurrency, seed = options.concurrency, options.seed
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        warm_until = time.monotonic() + options.warmup
        warmup: list[Sample] = []
        await asyncio.gather(
            *(client_loop(warmup, client, seed - 1 - i, warm_until) for i in range(concurrency))
        )
        await wait_idle(client)
        start = await snapshot(client, pid)
        samples: list[Sample] = []
        marks: list[RssMark] = []
        began = time.monotonic()
        until = began + options.duration
        watcher = asyncio.create_task(watch_rss(marks, pid, began, options.window))
        await asyncio.gather(*(client_loop(samples, client, seed + i, until) for i in range(concurrency)))
        watcher.cancel()
        await wait_idle(client)
        end = await snapshot(client, pid)
    return summarise(samples, began, start, end, options.window, options.duration, marks)


async def watch_rss(marks: list[RssMark], pid: int, began: float, window: float) -> None:
    """Record the server's RSS at the end of every window (shows whether growth levels off)."""
    while True:
        await asyncio.sleep(window - (time.monotonic() - began) % window)
        marks.append(RssMark(time.monotonic() - began, rss_bytes(pid)))


def is_expected(scenario: str, outcome: str) -> bool:
    """Success, or the refusal / disconnect the scenario asks for (not a server failure)."""
    if outcome == "ok":
        return True
    if scenario == "bad":
        return outcome.split(":")[0] in ("400", "415")
    return scenario == "disconnect" and outcome == "client_disconnected"


def summarise(
    samples: list[Sample],
    began: float,
    start: Snapshot,
    end: Snapshot,
    window: float,
    duration: float,
    marks: list[RssMark] | None = None,
) -> dict[str, Any]:
    """Outcomes, drift, and per window the latency of the requests that *started* in it (so the
    last requests, which end after the traffic stops, count in the last window) and the RSS at
    its end."""
    outcomes = Counter(f"{s.scenario}:{s.outcome}" for s in samples)
    unexpected = {k: v for k, v in outcomes.items() if not is_expected(*k.split(":", 1))}
    rss_at_end = {round(mark.at / window) - 1: mark.rss_bytes / 2**20 for mark in marks or []}
    windows = []
    for index in range(max(1, math.ceil(duration / window))):
        low, high = index * window, (index + 1) * window
        ok = [s.seconds for s in samples if low <= s.end - s.seconds - began < high and s.outcome == "ok"]
        windows.append(
            {
                "window": index,
                "requests": len(ok),
                "p50_s": percentile(ok, 50),
                "p99_s": percentile(ok, 99),
                "rss_end_mib": rss_at_end.get(index),
            }
        )
    return {
        "requests": len(samples),
        "outcomes": dict(sorted(outcomes.items())),
        "unexpected": unexpected,
        "rss_start_mib": start.rss_bytes / 2**20,
        "rss_end_mib": end.rss_bytes / 2**20,
        "rss_drift_pct": 100.0 * (end.rss_bytes - start.rss_bytes) / start.rss_bytes,
        "kv_usage_start": start.kv_usage,
        "kv_usage_end": end.kv_usage,
        "kv_free_blocks_end": end.free_blocks,
        "kv_total_blocks": end.total_blocks,
        "windows": windows,
    }


def format_report(summary: dict[str, Any], window: float) -> str:
    lines = [f"requests: {summary['requests']}", "outcomes (scenario:outcome):"]
    lines += [f"  {name:45s} {count}" for name, count in summary["outcomes"].items()]
    lines.append(f"unexpected errors: {sum(summary['unexpected'].values())} {summary['unexpected'] or ''}")
    lines.append(
        f"RSS: start {summary['rss_start_mib']:.1f} MiB, end {summary['rss_end_mib']:.1f} MiB, "
        f"drift {summary['rss_drift_pct']:+.2f}% (goal: under 5%)"
    )
    lines.append(
        f"KV usage: start {summary['kv_usage_start']:.3f}, end {summary['kv_usage_end']:.3f} "
        f"({summary['kv_free_blocks_end']:.0f} of {summary['kv_total_blocks']:.0f} blocks free; goal: back to idle)"
    )
    lines.append(f"latency of successful requests per {window:.0f} s window (by start time):")
    for row in summary["windows"]:
        rss = f"  RSS at its end {row['rss_end_mib']:.1f} MiB" if row.get("rss_end_mib") is not None else ""
        lines.append(
            f"  window {row['window']}: {row['requests']:6d} ok  p50 {row['p50_s']:.3f} s  "
            f"p99 {row['p99_s']:.3f} s{rss}"
        )
    first, last = summary["windows"][0], summary["windows"][-1]
    if first["requests"] and last["requests"]:
        lines.append(f"p50 last window / first window: {last['p50_s'] / first['p50_s']:.2f} (goal: no creep)")
    return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(options: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "fastdeploy", "serve", *options.server_args, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--uvicorn-log-level", "warning"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.kill()
    raise SystemExit("the server did not become healthy within 600 s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds of traffic (default 1200)")
    parser.add_argument("--window", type=float, default=300.0, help="latency window in seconds (default 300)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=60.0,
        help="seconds of traffic before the start snapshot (long enough to use every KV block once)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="clients at once (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--pid", type=int, default=None, help="the running server's process id (with --url)")
    parser.add_argument(
        "--server-args",
        nargs=argparse.REMAINDER,
        default=[
            "--max-model-len=2048",
            "--max-num-seqs=16",
            "--reasoning-parser=qwen3",
            f"--kv-cache-memory={256 * 2**20}",
        ],
        help="flags for the server this script starts (must come last)",
    )
    parser.add_argument("--json", default=None, help="also write the summary to this file")
    options = parser.parse_args(argv)
    if (options.url is None) != (options.pid is None):
        parser.error("--url and --pid go together")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    server = None
    url, pid = options.url, options.pid
    if url is None:
        server, url = start_server(options)
        pid = server.pid
    try:
        summary = asyncio.run(soak(url, pid, options))
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(120)
    print(format_report(summary, options.window))
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)
    return 0 if not summary["unexpected"] else 1


if __name__ == "__main__":
    sys.exit(main())
