"""The router's /metrics: its own counters, then every worker's metrics labelled by worker.

Each worker's samples keep their names and labels and gain `worker="<url>"`; the same sample
summed over the workers follows with `worker="total"` (ratios, i.e. gauges named `*_perc`,
`*_rate`, `*_usage` or `*_per_step`, are averaged instead, and `*_created` timestamps have no
total). A worker that does not answer is left out of that scrape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from fastdeploy.router.workers import Worker

TOTAL = "total"
_RATIO = re.compile(r"(_perc|_rate|_usage|_per_step)$")


class RouterMetrics:
    """Counters of what the router did, by worker."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "fastdeploy:router_requests",
            "Requests the router finished on a worker, by worker and outcome (ok: a 2xx answer; "
            "http_error: the worker answered >= 400; stream_failed: the worker failed mid-stream)",
            ["worker", "outcome"],
            registry=r,
        )
        self.retries = Counter(
            "fastdeploy:router_retries",
            "Requests moved to another worker because this one failed before sending anything",
            ["worker"],
            registry=r,
        )
        self.unserved = Counter(
            "fastdeploy:router_unserved_requests", "Requests no healthy worker could take", registry=r
        )
        self.outstanding = Gauge(
            "fastdeploy:router_outstanding_requests", "Requests in flight, by worker", ["worker"], registry=r
        )
        self.healthy = Gauge(
            "fastdeploy:router_worker_healthy",
            "1 while the worker is in routing, else 0",
            ["worker"],
            registry=r,
        )

    def render(self, workers: Iterable[Worker]) -> str:
        """The router's own metrics; the gauges are read from `workers` now."""
        for worker in workers:
            self.outstanding.labels(worker.url).set(worker.outstanding)
            self.healthy.labels(worker.url).set(1 if worker.healthy else 0)
        return generate_latest(self.registry).decode()


def merge_worker_metrics(texts: dict[str, str]) -> str:
    """Prometheus text of every worker's samples labelled by worker, each followed by its total.
    `texts`: worker URL -> that worker's /metrics text."""
    families: dict[str, tuple[str, str]] = {}  # name -> (type, help)
    samples: dict[str, dict[tuple, list[tuple[str, float]]]] = {}  # family -> sample key -> values
    for url, text in texts.items():
        for family in text_string_to_metric_families(text):
            families.setdefault(family.name, (family.type, family.documentation))
            by_key = samples.setdefault(family.name, {})
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "worker"))
                by_key.setdefault((sample.name, labels), []).append((url, sample.value))
    lines = []
    for name, (kind, documentation) in families.items():
        if not samples[name]:
            continue
        exposed = name + "_total" if kind == "counter" else name  # as prometheus_client writes it
        lines.append(f"# HELP {exposed} {_escape_help(documentation)}")
        lines.append(f"# TYPE {exposed} {kind}")
        for (sample_name, labels), values in samples[name].items():
            for url, value in values:
                lines.append(_sample_line(sample_name, labels, url, value))
            if sample_name.endswith("_created"):
                continue
            total = sum(value for _, value in values)
            if kind == "gauge" and _RATIO.search(name):
                total /= len(values)
            lines.append(_sample_line(sample_name, labels, TOTAL, total))
    return "\n".join(lines) + "\n" if lines else ""


def _sample_line(name: str, labels: tuple, worker: str, value: float) -> str:
    pairs = [*labels, ("worker", worker)]
    rendered = ",".join(f'{key}="{_escape_label(str(val))}"' for key, val in pairs)
    return f"{name}{{{rendered}}} {floatToGoString(value)}"


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")
