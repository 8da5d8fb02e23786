"""Prometheus metrics of the server, named as FastDeploy names them (`fastdeploy:...`).

Each server owns its own `CollectorRegistry` (several servers can live in one test process).
Gauges and engine-side histograms are fed by the engine thread's `StepStats` after every pass;
the request counter is bumped by the HTTP layer. Exposed at `GET /metrics` and, with
`--metrics-port`, on a separate port as well.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fastdeploy.engine.async_engine import StepStats
from fastdeploy.engine.spec_decode.decoder import SpecDecodeStats

#: content type of `render()`'s bytes
CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    """The server's metrics; `observe_step` is an `AsyncLLMEngine` step observer."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests_number = Counter("fastdeploy:requests_number", "Requests received", registry=r)
        self.request_success = Counter(
            "fastdeploy:request_success", "Requests that finished successfully", registry=r
        )
        self.num_requests_running = Gauge(
            "fastdeploy:num_requests_running", "Requests currently running", registry=r
        )
        self.num_requests_waiting = Gauge(
            "fastdeploy:num_requests_waiting", "Requests waiting to run", registry=r
        )
        self.cache_usage = Gauge(
            "fastdeploy:gpu_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1)", registry=r
        )
        self.free_blocks = Gauge(
            "fastdeploy:available_gpu_block_num", "KV-cache blocks not used by any request", registry=r
        )
        self.total_blocks = Gauge("fastdeploy:gpu_total_block_num", "KV-cache blocks in total", registry=r)
        self.prompt_tokens = Counter("fastdeploy:prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("fastdeploy:generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "fastdeploy:time_to_first_token_seconds",
            "Time from arrival to the first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "fastdeploy:time_per_output_token_seconds",
            "Time between consecutive generated tokens of a request",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "fastdeploy:e2e_request_latency_seconds",
            "Time from arrival to the last token",
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.request_prompt_tokens = Histogram(
            "fastdeploy:request_prompt_tokens",
            "Prompt tokens per request",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.request_generation_tokens = Histogram(
            "fastdeploy:request_generation_tokens",
            "Generated tokens per request",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.hit_token_rate = Gauge(
            "fastdeploy:hit_token_rate",
            "Share of prompt tokens served from the prefix cache since start (0..1)",
            registry=r,
        )
        self.hit_req_rate = Gauge(
            "fastdeploy:hit_req_rate",
            "Share of requests that found cached prefix blocks since start (0..1)",
            registry=r,
        )
        self.prefix_cache_tokens = Counter(
            "fastdeploy:prefix_cache_token_num", "Prompt tokens served from the prefix cache", registry=r
        )
        self._prefix_hit_tokens = 0
        self.requests_per_step = Histogram(
            "fastdeploy:requests_per_step",
            "Requests that received a token in one engine step (the decode batch size)",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )

        self.request_errors = Counter(
            "fastdeploy:request_errors",
            "Requests answered with an error (HTTP status >= 400 or an error event in a stream), by "
            "kind: the error's code, e.g. forward_error, nonfinite_logits, server_overloaded",
            ["kind"],
            registry=r,
        )
        self.spec_draft_tokens = Counter(
            "fastdeploy:spec_decode_num_draft_tokens",
            "Draft tokens proposed by speculative decoding",
            registry=r,
        )
        self.spec_accepted_tokens = Counter(
            "fastdeploy:spec_decode_num_accepted_tokens", "Draft tokens the target model accepted", registry=r
        )
        self.spec_emitted_tokens = Counter(
            "fastdeploy:spec_decode_num_emitted_tokens",
            "Tokens emitted by verify passes (accepted drafts plus one per pass)",
            registry=r,
        )
        self.spec_verify_steps = Counter(
            "fastdeploy:spec_decode_num_verify_steps", "Sequence passes that verified drafts", registry=r
        )
        self.spec_acceptance_rate = Gauge(
            "fastdeploy:spec_decode_draft_acceptance_rate",
            "Accepted over proposed draft tokens so far",
            registry=r,
        )
        self.spec_accepted_per_step = Gauge(
            "fastdeploy:spec_decode_accepted_tokens_per_step",
            "Draft tokens accepted per verify pass so far",
            registry=r,
        )
        self._spec_seen = SpecDecodeStats()

    def count_request(self) -> None:
        self.requests_number.inc()

    def count_error(self, kind: str) -> None:
        self.request_errors.labels(kind=kind).inc()

    def observe_step(self, stats: StepStats) -> None:
        """Update from one pass of the engine thread (called on that thread)."""
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        self.cache_usage.set(stats.kv_cache_usage)
        self.free_blocks.set(stats.num_free_blocks)
        self.total_blocks.set(stats.num_total_blocks)
        prefix = stats.prefix_cache
        self.hit_token_rate.set(prefix.hit_token_rate)
        self.hit_req_rate.set(prefix.hit_request_rate)
        if prefix.hit_tokens > self._prefix_hit_tokens:
            self.prefix_cache_tokens.inc(prefix.hit_tokens - self._prefix_hit_tokens)
            self._prefix_hit_tokens = prefix.hit_tokens
        if stats.requests_in_step:
            self.requests_per_step.observe(stats.requests_in_step)
        if stats.prompt_tokens:
            self.prompt_tokens.inc(stats.prompt_tokens)
        if stats.generation_tokens:
            self.generation_tokens.inc(stats.generation_tokens)
        for seconds in stats.first_token_latencies:
            self.ttft.observe(seconds)
        for seconds in stats.inter_token_latencies:
            self.tpot.observe(seconds)
        if stats.spec_decode is not None:
            self._observe_spec_decode(stats.spec_decode)
        for output in stats.finished:
            if output.error_code != 200 or output.outputs.finish_reason == "abort":
                continue
            self.request_success.inc()
            self.e2e.observe(output.metrics.model_execute_time)
            self.request_prompt_tokens.observe(len(output.prompt_token_ids))
            self.request_generation_tokens.observe(sum(len(s.token_ids) for s in output.outputs))

    def _observe_spec_decode(self, totals: SpecDecodeStats) -> None:
        seen = self._spec_seen
        self.spec_draft_tokens.inc(totals.num_draft_tokens - seen.num_draft_tokens)
        self.spec_accepted_tokens.inc(totals.num_accepted_tokens - seen.num_accepted_tokens)
        self.spec_emitted_tokens.inc(totals.num_emitted_tokens - seen.num_emitted_tokens)
        self.spec_verify_steps.inc(totals.num_verify_steps - seen.num_verify_steps)
        if totals.num_draft_tokens:
            self.spec_acceptance_rate.set(totals.num_accepted_tokens / totals.num_draft_tokens)
        if totals.num_verify_steps:
            self.spec_accepted_per_step.set(totals.num_accepted_tokens / totals.num_verify_steps)
        self._spec_seen = totals

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
