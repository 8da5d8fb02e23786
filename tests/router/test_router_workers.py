"""Worker addresses, the workers file, and health checks (httpx's mock transport for workers)."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.router.workers import WorkerList, WorkerSet, parse_worker_url, read_workers_file


def test_worker_addresses_are_normalised_or_refused_naming_the_flag():
    assert parse_worker_url(" http://10.0.0.5:8000/ ", "--workers") == "http://10.0.0.5:8000"
    assert parse_worker_url("https://worker.example:443", "--workers") == "https://worker.example:443"
    for bad in ("10.0.0.5:8000", "http://10.0.0.5", "http://10.0.0.5:port", "ftp://h:1", "http://h:1/v1"):
        with pytest.raises(InvalidArgumentError, match=f"--workers: '{bad}' is not a worker address"):
            parse_worker_url(bad, "--workers")


def test_the_workers_file_lists_one_address_a_line_with_comments(tmp_path):
    listing = tmp_path / "workers"
    listing.write_text("# pool\nhttp://127.0.0.1:8001\n\n  http://127.0.0.1:8002/  # second\n")
    assert read_workers_file(str(listing)) == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]


def test_an_unreadable_or_invalid_workers_file_is_refused_naming_the_flag_and_line(tmp_path):
    with pytest.raises(InvalidArgumentError, match="--workers-file: cannot read .*No such file"):
        read_workers_file(str(tmp_path / "missing"))
    listing = tmp_path / "workers"
    listing.write_text("http://127.0.0.1:8001\nlocalhost:8002\n")
    with pytest.raises(InvalidArgumentError, match="--workers-file '.*' line 2: 'localhost:8002'"):
        read_workers_file(str(listing))
    listing.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InvalidArgumentError, match="--workers-file: cannot read"):
        read_workers_file(str(listing))


def test_a_rewritten_file_adds_and_removes_workers_and_a_bad_rewrite_keeps_them(tmp_path):
    listing = tmp_path / "workers"
    listing.write_text("http://127.0.0.1:8001\n")
    pool = WorkerSet(WorkerList("mixed", ["http://127.0.0.1:9000"], str(listing)))
    first = pool.all[1]
    assert [w.url for w in pool.all] == ["http://127.0.0.1:9000", "http://127.0.0.1:8001"]
    listing.write_text("http://127.0.0.1:8001\nhttp://127.0.0.1:8002\n")
    os.utime(listing, ns=(1, 1))  # a different stamp even within the clock's resolution
    pool.reload_file()
    assert [w.url for w in pool.all] == [
        "http://127.0.0.1:9000",
        "http://127.0.0.1:8001",
        "http://127.0.0.1:8002",
    ]
    assert pool.all[1] is first  # a worker kept keeps its state
    listing.write_text("garbage\n")
    pool.reload_file()
    assert len(pool.all) == 3
    listing.write_text("http://127.0.0.1:8002\n")
    os.utime(listing, ns=(2, 2))
    pool.reload_file()
    assert [w.url for w in pool.all] == ["http://127.0.0.1:9000", "http://127.0.0.1:8002"]


def test_health_checks_take_workers_out_and_put_them_back():
    verdicts = {"http://w1:1": 200, "http://w2:2": 503, "http://w3:3": None}

    def answer(request: httpx.Request) -> httpx.Response:
        status = verdicts[f"{request.url.scheme}://{request.url.host}:{request.url.port}"]
        if status is None:
            raise httpx.ConnectError("connection refused", request=request)
        assert request.url.path == "/health"
        return httpx.Response(status)

    pool = WorkerSet(WorkerList("mixed", list(verdicts)))

    async def check() -> list[str]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            await pool.check(client, timeout=1)
        return [worker.url for worker in pool.available()]

    assert asyncio.run(check()) == ["http://w1:1"]
    assert "503" in pool.all[1].last_error and "ConnectError" in pool.all[2].last_error
    verdicts.update({"http://w1:1": None, "http://w2:2": 200, "http://w3:3": 200})
    assert asyncio.run(check()) == ["http://w2:2", "http://w3:3"]


def test_a_worker_listed_in_two_roles_is_refused_and_a_rewrite_that_does_so_is_ignored(tmp_path):
    url = "http://127.0.0.1:8001"
    with pytest.raises(
        InvalidArgumentError, match=f"--decode-workers: {url} is also listed by --prefill-workers"
    ):
        WorkerSet(WorkerList("prefill", [url]), WorkerList("decode", [url]))
    listing = tmp_path / "decode"
    listing.write_text("http://127.0.0.1:8002\n")
    pool = WorkerSet(WorkerList("prefill", [url]), WorkerList("decode", [], str(listing)))
    assert [(w.url, w.role) for w in pool.all] == [(url, "prefill"), ("http://127.0.0.1:8002", "decode")]
    listing.write_text(f"{url}\n")
    os.utime(listing, ns=(1, 1))
    pool.reload_file()  # the prefill worker cannot also be a decode worker: the old list stays
    assert [(w.url, w.role) for w in pool.all] == [(url, "prefill"), ("http://127.0.0.1:8002", "decode")]
