"""benchmarks/soak.py: its summary arithmetic, and a few seconds of its mixed traffic against the
session's server (the 20-minute run is a benchmark, not a test)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location(
        "soak_benchmark", os.path.join(ROOT, "benchmarks", "soak.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_summary_windows_and_drift(soak):
    start = soak.Snapshot(rss_bytes=100 * 2**20, kv_usage=0.0, free_blocks=10, total_blocks=10)
    end = soak.Snapshot(rss_bytes=103 * 2**20, kv_usage=0.0, free_blocks=10, total_blocks=10)
    samples = [  # windows go by start time (end - seconds), so the 9-to-12 s request is in the first
        soak.Sample(end=2.0, scenario="short", outcome="ok", seconds=1.0),
        soak.Sample(end=12.0, scenario="short", outcome="ok", seconds=3.0),
        soak.Sample(end=3.0, scenario="bad", outcome="415:unsupported_media_type", seconds=0.1),
        soak.Sample(end=13.0, scenario="stream", outcome="ok", seconds=2.0),
        soak.Sample(end=13.0, scenario="disconnect", outcome="client_disconnected", seconds=0.5),
        soak.Sample(end=14.0, scenario="long", outcome="500:forward_error", seconds=0.5),
        soak.Sample(end=25.0, scenario="short", outcome="ok", seconds=6.0),  # started in the last window
    ]
    marks = [soak.RssMark(at=10.02, rss_bytes=101 * 2**20), soak.RssMark(at=20.01, rss_bytes=102 * 2**20)]
    summary = soak.summarise(
        samples, began=0.0, start=start, end=end, window=10.0, duration=20.0, marks=marks
    )
    assert summary["requests"] == 7
    assert summary["unexpected"] == {"long:500:forward_error": 1}
    assert summary["rss_drift_pct"] == pytest.approx(3.0)
    first, second = summary["windows"]
    assert (first["requests"], first["p50_s"], second["requests"], second["p50_s"]) == (2, 2.0, 2, 4.0)
    assert first["p99_s"] == pytest.approx(1.0 + 2.0 * 0.99)
    assert (first["rss_end_mib"], second["rss_end_mib"]) == (101.0, 102.0)
    report = soak.format_report(summary, 10.0)
    assert "window 1:      2 ok  p50 4.000 s" in report and "RSS at its end 102.0 MiB" in report


def test_a_short_soak_has_no_unexpected_errors_and_frees_every_block(soak, server):
    options = argparse.Namespace(duration=8.0, warmup=1.0, window=4.0, concurrency=4, seed=3)
    summary = asyncio.run(soak.soak(server.url, server.process.pid, options))
    assert summary["requests"] > 0
    assert summary["unexpected"] == {}
    assert summary["kv_usage_end"] == 0.0 and summary["kv_free_blocks_end"] == summary["kv_total_blocks"]
    report = soak.format_report(summary, options.window)
    assert "RSS: start" in report and "KV usage: start" in report and "window 0:" in report
