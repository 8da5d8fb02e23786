"""The router pairing prefill and decode workers (stand-ins: real processes on loopback, no model):
what each side is sent, retries of a failed prefill worker, a failed transfer ending its request
alone, a decode worker dying mid-stream, and the start-up refusals naming the flags."""

from __future__ import annotations

import json
import urllib.request

import pytest
from router_helpers import free_port, http_post, kill, metric, standin_state, start_router, start_standin

from fastdeploy.cli import main


@pytest.fixture
def layout():
    """Two prefill and two decode stand-ins behind a router whose health checks are rare (a
    dead worker is found by the requests that meet it)."""
    workers = {
        "p1": start_standin("p1", "--role", "prefill"),
        "p2": start_standin("p2", "--role", "prefill"),
        "d1": start_standin("d1", "--role", "decode"),
        "d2": start_standin("d2", "--role", "decode"),
    }
    router = None
    try:
        router = start_router(
            [],
            "--prefill-workers",
            workers["p1"].url,
            workers["p2"].url,
            "--decode-workers",
            workers["d1"].url,
            workers["d2"].url,
            "--health-interval",
            "60",
        )
        yield router, workers
    finally:
        if router is not None:
            router.stop()
        for worker in workers.values():
            if worker.process.poll() is None:
                worker.stop()


def served_by(workers: dict, names: list[str]) -> dict[str, list[dict]]:
    return {name: standin_state(workers[name])["bodies"] for name in names}


def test_the_prefill_worker_gets_one_token_and_the_decode_address_then_decode_gets_the_request(layout):
    router, workers = layout
    request = {"model": "m", "prompt": "hello there", "max_tokens": 7, "stream": False, "n": 1}
    status, body = http_post(router.url + "/v1/completions", request)
    assert status == 200
    bodies = served_by(workers, ["p1", "p2", "d1", "d2"])
    prefill = [b for name in ("p1", "p2") for b in bodies[name]]
    decode = [(name, b) for name in ("d1", "d2") for b in bodies[name]]
    assert len(prefill) == 1 and len(decode) == 1
    assert body["worker"] == decode[0][0]
    assert prefill[0] == {
        **request,
        "max_tokens": 1,
        "min_tokens": 0,
        "kv_transfer_params": {"decode_address": "127.0.0.1:5999"},  # the decode stand-in's KV port
    }
    assert decode[0][1] == request  # unchanged


def test_a_stream_is_relayed_from_the_decode_worker(layout):
    router, workers = layout
    request = {"prompt": "hi", "stream": True, "chunks": 4, "stream_options": {"include_usage": True}}
    data = json.dumps(request).encode()
    sent = urllib.request.Request(
        router.url + "/v1/completions", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(sent, timeout=60) as response:
        events = [line for line in response.read().decode().split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and len(events) == 5
    prefill = [b for name in ("p1", "p2") for b in standin_state(workers[name])["bodies"]]
    assert prefill[0]["stream"] is False and "stream_options" not in prefill[0]


def test_a_dead_prefill_worker_is_skipped_and_its_request_served_by_another(layout):
    router, workers = layout
    kill(workers["p1"])
    for index in range(3):  # least-outstanding would have sent some of them to p1
        status, _ = http_post(router.url + "/v1/completions", {"prompt": f"request {index}", "max_tokens": 2})
        assert status == 200
    assert len(standin_state(workers["p2"])["bodies"]) == 3
    metrics = urllib.request.urlopen(router.url + "/metrics", timeout=30).read().decode()
    assert metric(metrics, "fastdeploy:router_retries_total", worker=workers["p1"].url) == 1


def test_a_failed_transfer_ends_its_request_alone(layout):
    router, workers = layout
    failing = {"prompt": "fail-prefill@p1 fail-prefill@p2", "max_tokens": 2}
    status, body = http_post(router.url + "/v1/completions", failing)
    assert status == 504 and "KV transfer failed" in body["error"]["message"]
    status, _ = http_post(router.url + "/v1/completions", {"prompt": "fine", "max_tokens": 2})
    assert status == 200
    decoded = [b["prompt"] for name in ("d1", "d2") for b in standin_state(workers[name])["bodies"]]
    assert decoded == ["fine"]  # the failed request never reached a decode worker


def test_a_decode_worker_killed_mid_stream_ends_the_stream_and_new_requests_avoid_it(layout):
    router, workers = layout
    request = {"prompt": "hold-after-first@d1 hold-after-first@d2", "stream": True, "chunks": 5}
    sent = urllib.request.Request(
        router.url + "/v1/completions",
        data=json.dumps(request).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(sent, timeout=60) as response:
        first = response.readline()
        assert first.startswith(b"data: ")
        busy = next(name for name in ("d1", "d2") if standin_state(workers[name])["held"] == 1)
        kill(workers[busy])
        rest = response.read().decode()
    assert "the worker serving this stream failed" in rest and rest.endswith("data: [DONE]\n\n")
    survivor = "d2" if busy == "d1" else "d1"
    for _ in range(2):
        status, body = http_post(router.url + "/v1/completions", {"prompt": "after", "max_tokens": 2})
        assert status == 200 and body["worker"] == survivor


def refusal(capsys, *argv: str) -> str:
    """stderr of `fastdeploy router ARGV`, which must exit 2 without serving."""
    status = main(["router", "--startup-timeout", "20", "--port", str(free_port()), *argv])
    assert status == 2
    return capsys.readouterr().err


def test_decode_workers_without_a_prefill_peer_are_refused(capsys):
    err = refusal(capsys, "--decode-workers", "http://127.0.0.1:1")
    assert "error: --prefill-workers: the decode workers need a prefill peer; none given" in err
    err = refusal(capsys, "--prefill-workers", "http://127.0.0.1:1")
    assert "error: --decode-workers: the prefill workers need a decode peer; none given" in err


def test_no_reachable_decode_worker_is_refused_naming_its_flag(capsys):
    prefill = start_standin("p", "--role", "prefill")
    try:
        nobody = f"http://127.0.0.1:{free_port()}"
        err = refusal(
            capsys, "--startup-timeout", "0", "--prefill-workers", prefill.url, "--decode-workers", nobody
        )
        assert f"error: --decode-workers: no reachable worker within 0 s ({nobody}: /health failed" in err
    finally:
        prefill.stop()


@pytest.mark.parametrize(
    ("decode_flags", "expected"),
    [
        (["--block-size", "32"], "its KV block_size 32 differs from 16"),
        (["--model", "other-model"], "its KV model 'other-model' differs from 'standin'"),
    ],
)
def test_paired_workers_must_agree_on_model_and_block_size(capsys, decode_flags, expected):
    prefill = start_standin("p", "--role", "prefill")
    decode = start_standin("d", "--role", "decode", *decode_flags)
    try:
        err = refusal(capsys, "--prefill-workers", prefill.url, "--decode-workers", decode.url)
        assert (
            f"error: --prefill-workers/--decode-workers: {decode.url} cannot be paired with {prefill.url}"
            in err
        )
        assert expected in err
    finally:
        prefill.stop()
        decode.stop()


def test_a_worker_in_the_wrong_role_is_refused(capsys):
    prefill = start_standin("p", "--role", "prefill")
    mixed = start_standin("m")
    try:
        err = refusal(capsys, "--prefill-workers", prefill.url, "--decode-workers", mixed.url)
        assert f"error: --decode-workers: {mixed.url} is a mixed instance" in err
        assert "--splitwise-role decode" in err
    finally:
        prefill.stop()
        mixed.stop()


def test_plain_workers_cannot_join_a_disaggregated_router(capsys):
    err = refusal(
        capsys,
        "--workers",
        "http://127.0.0.1:1",
        "--prefill-workers",
        "http://127.0.0.1:2",
        "--decode-workers",
        "http://127.0.0.1:3",
    )
    assert "error: --workers/--workers-file cannot be combined with --prefill-workers/--decode-workers" in err
