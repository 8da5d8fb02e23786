"""The router passes each chunk of a stream on as it arrives, without holding it back.

The stand-in worker sends a chunk, then waits until the test releases it before sending the next
one. Each chunk must reach the client through the router while the worker is still waiting: a
router that buffered (waiting for more bytes, a second event, or the end of the stream) would leave
the client's read waiting for a chunk that only the client's own release can cause, and the read
times out. No timing is measured and nothing sleeps.
"""

from __future__ import annotations

import json

import httpx
import pytest
from router_helpers import http_post, standin_state, start_router, start_standin

CHUNKS = 4


@pytest.fixture(scope="module")
def worker_and_router():
    worker = start_standin("s")
    router = start_router([worker.url])
    yield worker, router
    assert router.stop(10) == 0, router.output()
    worker.stop(5)


def test_each_chunk_reaches_the_client_before_the_worker_sends_the_next(worker_and_router):
    worker, router = worker_and_router
    payload = {"prompt": "step@s", "stream": True, "chunks": CHUNKS}
    # the read timeout is a hang guard: a buffering router leaves the read below waiting forever
    with (
        httpx.Client(timeout=httpx.Timeout(60)) as client,
        client.stream("POST", router.url + "/v1/completions", json=payload) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = (line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: "))
        for index in range(CHUNKS):
            chunk = json.loads(next(events))
            assert (chunk["worker"], chunk["index"]) == ("s", index)
            # the worker cannot have sent chunk index+1 yet: it waits for this release
            assert standin_state(worker)["released"] == index
            assert http_post(worker.url + "/release", {})[0] == 200
        assert next(events) == "[DONE]"
        assert list(events) == []
