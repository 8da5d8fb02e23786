"""Joining the workers' Prometheus text: each sample labelled by worker, then its total."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from fastdeploy.router.metrics import merge_worker_metrics

WORKER_1 = """# HELP fastdeploy:requests_number_total Requests received
# TYPE fastdeploy:requests_number_total counter
fastdeploy:requests_number_total 3.0
# HELP fastdeploy:requests_number_created Requests received
# TYPE fastdeploy:requests_number_created gauge
fastdeploy:requests_number_created 1.7e+09
# HELP fastdeploy:gpu_cache_usage_perc KV-cache usage
# TYPE fastdeploy:gpu_cache_usage_perc gauge
fastdeploy:gpu_cache_usage_perc 0.25
# HELP fastdeploy:num_requests_running Running
# TYPE fastdeploy:num_requests_running gauge
fastdeploy:num_requests_running 2.0
# HELP fastdeploy:e2e_request_latency_seconds Latency
# TYPE fastdeploy:e2e_request_latency_seconds histogram
fastdeploy:e2e_request_latency_seconds_bucket{le="1.0"} 1.0
fastdeploy:e2e_request_latency_seconds_bucket{le="+Inf"} 3.0
fastdeploy:e2e_request_latency_seconds_count 3.0
fastdeploy:e2e_request_latency_seconds_sum 4.5
"""
WORKER_2 = """# TYPE fastdeploy:requests_number_total counter
fastdeploy:requests_number_total 5.0
# TYPE fastdeploy:gpu_cache_usage_perc gauge
fastdeploy:gpu_cache_usage_perc 0.75
# TYPE fastdeploy:num_requests_running gauge
fastdeploy:num_requests_running 1.0
# TYPE fastdeploy:e2e_request_latency_seconds histogram
fastdeploy:e2e_request_latency_seconds_bucket{le="1.0"} 2.0
fastdeploy:e2e_request_latency_seconds_bucket{le="+Inf"} 2.0
fastdeploy:e2e_request_latency_seconds_count 2.0
fastdeploy:e2e_request_latency_seconds_sum 0.5
"""


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_each_workers_samples_are_labelled_and_summed_ratios_averaged():
    one, two = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
    merged = samples(merge_worker_metrics({one: WORKER_1, two: WORKER_2}))
    running = "fastdeploy:num_requests_running"
    assert merged[("fastdeploy:requests_number_total", (("worker", one),))] == 3
    assert merged[("fastdeploy:requests_number_total", (("worker", two),))] == 5
    assert merged[("fastdeploy:requests_number_total", (("worker", "total"),))] == 8
    assert merged[(running, (("worker", "total"),))] == 3
    assert merged[("fastdeploy:gpu_cache_usage_perc", (("worker", "total"),))] == 0.5  # (0.25 + 0.75) / 2
    bucket = "fastdeploy:e2e_request_latency_seconds_bucket"
    assert merged[(bucket, (("le", "1.0"), ("worker", "total")))] == 3
    assert merged[(bucket, (("le", "+Inf"), ("worker", "total")))] == 5
    assert merged[("fastdeploy:e2e_request_latency_seconds_sum", (("worker", "total"),))] == 5.0
    assert ("fastdeploy:requests_number_created", (("worker", one),)) in merged
    assert ("fastdeploy:requests_number_created", (("worker", "total"),)) not in merged


def test_a_counter_keeps_its_exposed_name_and_type():
    text = merge_worker_metrics({"http://10.0.0.1:8000": WORKER_1})
    assert "# TYPE fastdeploy:requests_number_total counter" in text
    assert "# TYPE fastdeploy:e2e_request_latency_seconds histogram" in text


def test_no_workers_no_text():
    assert merge_worker_metrics({}) == ""
