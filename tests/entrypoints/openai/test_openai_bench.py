"""`fastdeploy bench serve` against the test server: every request completes, batching is seen."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from fastdeploy.entrypoints.openai.benchmark import format_report, percentile


def bench(server, *args):
    done = subprocess.run(
        [sys.executable, "-m", "fastdeploy", "bench", "serve", "--port", str(server.port), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_bench_serve_with_32_clients(server):
    summary = json.loads(
        bench(
            server,
            "--num-prompts",
            "32",
            "--concurrency",
            "32",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--json",
        )
    )
    assert summary["completed"] == 32 and summary["failed"] == 0
    assert summary["output_tokens"] == 32 * 6
    assert summary["peak_running_requests"] > 1
    assert summary["output_throughput"] > 0
    for key in ("ttft_s", "itl_s", "e2e_s"):
        stats = summary[key]
        assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"], key
    assert summary["ttft_s"]["p50"] <= summary["e2e_s"]["p50"]


def test_bench_serve_text_report_on_chat(server):
    report = bench(
        server, "--endpoint", "chat", "--num-prompts", "2", "--concurrency", "2", "--max-tokens", "4"
    )
    assert "requests: 2 ok, 0 failed" in report
    assert "TTFT" in report and "ITL" in report and "output token throughput" in report


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.05]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


@pytest.mark.parametrize("ttft", [0.05, math.nan])
def test_report_says_why_latencies_are_missing(ttft):
    """A model whose tokens decode to no text (random weights, a byte tokenizer) streams no text
    chunk: the report says why TTFT and ITL read nan instead of leaving the reader to guess."""
    stats = {name: ttft for name in ("mean", "p50", "p90", "p99")}
    summary = {
        "model": "m",
        "endpoint": "/v1/completions",
        "concurrency": 1,
        "completed": 1,
        "failed": 0,
        "duration_s": 1.0,
        "request_throughput": 1.0,
        "output_throughput": 4.0,
        "total_token_throughput": 8.0,
        "peak_running_requests": 1,
        "ttft_s": stats,
        "itl_s": stats,
        "tpot_s": stats,
        "e2e_s": {name: 1.0 for name in stats},
        "errors": [],
    }
    note = "no chunk did (the model's tokens decode to no text)"
    assert (note in format_report(summary)) == math.isnan(ttft)
