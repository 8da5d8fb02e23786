"""Prefill and decode workers listed in files (--prefill-workers-file / --decode-workers-file)
that change while the router runs: workers added and removed by a rewrite, and a worker added
in the wrong role or with another KV layout kept out of routing. Stand-in workers, real
processes on loopback."""

from __future__ import annotations

import json
import os

import pytest
from router_helpers import http_get, http_post, standin_state, start_router, start_standin, wait_until


@pytest.fixture
def standins():
    """p1 (prefill), d1 and d2 (decode), d3 (decode, another block size), p2 (prefill)."""
    workers = {
        "p1": start_standin("p1", "--role", "prefill"),
        "d1": start_standin("d1", "--role", "decode"),
        "d2": start_standin("d2", "--role", "decode"),
        "d3": start_standin("d3", "--role", "decode", "--block-size", "32"),
        "p2": start_standin("p2", "--role", "prefill"),
    }
    yield workers
    for worker in workers.values():
        worker.stop(5)


def write(path, *workers) -> None:
    """Replace the file's list at once (write aside, rename over), as the docs advise."""
    aside = path.with_suffix(".new")
    aside.write_text("".join(f"{worker.url}\n" for worker in workers))
    os.replace(aside, path)


def health(router) -> dict[str, str]:
    return json.loads(http_get(router.url + "/health")[1])["workers"]


def served(router, prompt: str) -> str:
    status, body = http_post(router.url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert status == 200, body
    return body["worker"]


def test_rewritten_prefill_and_decode_files_move_requests_and_bad_newcomers_stay_out(standins, tmp_path):
    prefill_file, decode_file = tmp_path / "prefill.txt", tmp_path / "decode.txt"
    write(prefill_file, standins["p1"])
    write(decode_file, standins["d1"])
    router = start_router(
        [], "--prefill-workers-file", str(prefill_file), "--decode-workers-file", str(decode_file)
    )
    try:
        assert health(router) == {standins["p1"].url: "healthy", standins["d1"].url: "healthy"}
        assert served(router, "first") == "d1"

        # d1 leaves, d2 joins; p1 stays
        write(decode_file, standins["d2"])
        wait_until(
            lambda: health(router) == {standins["p1"].url: "healthy", standins["d2"].url: "healthy"},
            30,
            "the router to follow the decode file",
        )
        assert served(router, "second") == "d2"
        assert [body["prompt"] for body in standin_state(standins["d1"])["bodies"]] == ["first"]

        # a prefill worker listed as decode, and a decode worker with another block size: both
        # answer /health, neither may be paired
        write(decode_file, standins["d2"], standins["p2"], standins["d3"])
        wait_until(
            lambda: {standins["p2"].url, standins["d3"].url} <= set(health(router)),
            30,
            "the router to read the decode file again",
        )
        refusals = (
            f"{standins['p2'].url} is a prefill instance; start it with `fastdeploy serve --splitwise-role "
            "decode`",
            f"{standins['d3'].url} cannot be paired with {standins['p1'].url}: its KV block_size 32 "
            "differs from 16",
        )
        wait_until(lambda: all(refusal in router.output() for refusal in refusals), 30, "the pairing checks")
        assert health(router)[standins["p2"].url] == "unhealthy"
        assert health(router)[standins["d3"].url] == "unhealthy"
        for index in range(3):
            assert served(router, f"after {index}") == "d2"
        assert standin_state(standins["p2"])["bodies"] == []  # never sent a request
        assert standin_state(standins["d3"])["bodies"] == []
    finally:
        assert router.stop(10) == 0, router.output()
