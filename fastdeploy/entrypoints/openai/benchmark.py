"""Load generator for a running OpenAI-compatible server (`fastdeploy bench serve`).

`concurrency` client threads, each with its own HTTP connection, send streaming requests until
`num_prompts` have been sent. For every request we record when it was sent, when each chunk
carrying text arrived, and the server's `usage`; from these come time to first token (TTFT),
inter-token latency (ITL: gaps between text chunks), time per output token (TPOT) and
end-to-end latency, and the run's request and token throughput. A side thread polls `/metrics`
to report how many requests the server ran at once. Only the standard library is used, so the
benchmark adds no dependency and its own overhead stays small and predictable.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fastdeploy.errors import InvalidArgumentError

_TOPICS = (
    "Explain how a bicycle stays upright",
    "Write a short story about a lighthouse keeper",
    "Describe the water cycle to a child",
    "List some tips for learning a new language",
    "What makes a good cup of tea?",
    "Summarise the history of the printing press",
    "Give advice to someone starting to run",
    "Describe a busy market in the morning",
)


def default_prompts(count: int) -> list[str]:
    """`count` distinct prompts (topics cycled, each numbered)."""
    return [f"{_TOPICS[i % len(_TOPICS)]} (request {i})." for i in range(count)]


@dataclass
class BenchConfig:
    base_url: str
    model: str | None = None
    endpoint: str = "completions"
    num_prompts: int = 64
    concurrency: int = 32
    max_tokens: int = 64
    temperature: float = 0.0
    ignore_eos: bool = False
    api_key: str | None = None
    timeout: float = 600.0
    prompts: list[str] | None = None


@dataclass
class RequestResult:
    ok: bool
    sent: float
    ttft: float | None = None
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(math.floor(position))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _stats(values: list[float]) -> dict[str, float]:
    mean = sum(values) / len(values) if values else math.nan
    return {
        "mean": mean,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


class _Target:
    def __init__(self, base_url: str, api_key: str | None, timeout: float) -> None:
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme != "http" or not parts.hostname:
            raise InvalidArgumentError(f"base URL must look like http://HOST:PORT, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def get_json(self, path: str) -> Any:
        conn = self.connect()
        try:
            conn.request("GET", self.prefix + path, headers=self.headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"GET {path} answered {response.status}: {body[:200]!r}")
            return json.loads(body)
        finally:
            conn.close()

    def get_text(self, path: str) -> str:
        conn = self.connect()
        try:
            conn.request("GET", self.prefix + path)
            return conn.getresponse().read().decode("utf-8", "replace")
        finally:
            conn.close()


def _payload(config: BenchConfig, model: str, prompt: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "ignore_eos": config.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    return payload


def _chunk_text(chunk: dict[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if delta is not None:
            text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        else:
            text += choice.get("text") or ""
    return text


def _send(
    conn: http.client.HTTPConnection, target: _Target, path: str, payload: dict[str, Any]
) -> RequestResult:
    sent = time.perf_counter()
    result = RequestResult(ok=False, sent=sent)
    conn.request("POST", target.prefix + path, body=json.dumps(payload), headers=target.headers)
    response = conn.getresponse()
    if response.status != 200:
        result.error = f"HTTP {response.status}: {response.read()[:300].decode('utf-8', 'replace')}"
        result.latency = time.perf_counter() - sent
        return result
    last = None
    while True:
        line = response.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            result.ok = result.error is None
            break
        chunk = json.loads(data)
        now = time.perf_counter()
        if "error" in chunk:
            result.error = chunk["error"].get("message", "error event")
            continue
        if chunk.get("usage"):
            result.output_tokens = chunk["usage"].get("completion_tokens", 0)
            result.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
        if _chunk_text(chunk):
            if last is None:
                result.ttft = now - sent
            else:
                result.itl.append(now - last)
            last = now
    response.read()
    result.latency = time.perf_counter() - sent
    if not result.ok and result.error is None:
        result.error = "stream ended without [DONE]"
    return result


def _peak_running(target: _Target, stop: threading.Event, peak: list[float]) -> None:
    while not stop.is_set():
        try:
            text = target.get_text("/metrics")
        except OSError:
            text = ""
        for line in text.splitlines():
            if line.startswith("fastdeploy:num_requests_running "):
                peak[0] = max(peak[0], float(line.split()[-1]))
        stop.wait(0.2)


def run_benchmark(config: BenchConfig) -> dict[str, Any]:
    """Drive the server; return the summary (throughput, latency percentiles in seconds)."""
    if config.endpoint not in ("completions", "chat"):
        raise InvalidArgumentError(f"endpoint must be 'completions' or 'chat', got {config.endpoint!r}")
    if config.concurrency < 1 or config.num_prompts < 1:
        raise InvalidArgumentError("concurrency and num_prompts must be >= 1")
    target = _Target(config.base_url, config.api_key, config.timeout)
    model = config.model or target.get_json("/v1/models")["data"][0]["id"]
    prompts = config.prompts or default_prompts(config.num_prompts)
    queue = [prompts[i % len(prompts)] for i in range(config.num_prompts)]
    path = "/v1/chat/completions" if config.endpoint == "chat" else "/v1/completions"
    lock = threading.Lock()
    results: list[RequestResult] = []

    def worker() -> None:
        conn = target.connect()
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    prompt = queue.pop()
                try:
                    result = _send(conn, target, path, _payload(config, model, prompt))
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    conn.close()
                    conn = target.connect()
                    result = RequestResult(
                        ok=False, sent=time.perf_counter(), error=f"{type(exc).__name__}: {exc}"
                    )
                with lock:
                    results.append(result)
        finally:
            conn.close()

    stop = threading.Event()
    peak = [0.0]
    poller = threading.Thread(target=_peak_running, args=(target, stop, peak), daemon=True)
    poller.start()
    threads = [
        threading.Thread(target=worker, daemon=True)
        for _ in range(min(config.concurrency, config.num_prompts))
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    duration = time.perf_counter() - start
    stop.set()
    poller.join()
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    tpot = [
        (r.latency - r.ttft) / (r.output_tokens - 1)
        for r in done
        if r.ttft is not None and r.output_tokens > 1
    ]
    return {
        "model": model,
        "endpoint": path,
        "concurrency": config.concurrency,
        "num_prompts": config.num_prompts,
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "request_throughput": len(done) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (output_tokens + prompt_tokens) / duration,
        "ttft_s": _stats([r.ttft for r in done if r.ttft is not None]),
        "itl_s": _stats([gap for r in done for gap in r.itl]),
        "tpot_s": _stats(tpot),
        "e2e_s": _stats([r.latency for r in done]),
        "peak_running_requests": peak[0],
    }


def format_report(summary: dict[str, Any]) -> str:
    """The summary as a human-readable table (latencies in milliseconds)."""
    lines = [
        f"model: {summary['model']}  endpoint: {summary['endpoint']}",
        f"concurrency: {summary['concurrency']}  requests: {summary['completed']} ok, {summary['failed']} failed",
        f"duration: {summary['duration_s']:.2f} s",
        f"request throughput: {summary['request_throughput']:.2f} req/s",
        f"output token throughput: {summary['output_throughput']:.1f} tok/s",
        f"total token throughput: {summary['total_token_throughput']:.1f} tok/s",
        f"peak running requests (from /metrics): {summary['peak_running_requests']:.0f}",
        f"{'latency (ms)':<14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        stats = summary[key]
        lines.append(
            f"{label:<14}" + "".join(f"{stats[name] * 1000:>10.1f}" for name in ("mean", "p50", "p90", "p99"))
        )
    if summary["completed"] and math.isnan(summary["ttft_s"]["mean"]):
        lines.append(
            "TTFT, ITL and TPOT are timed from streamed chunks that carry text; no chunk did "
            "(the model's tokens decode to no text)"
        )
    for error in summary["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines) + "\n"
