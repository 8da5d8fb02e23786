"""The router in front of two real `fastdeploy serve` workers (the embedded SmolLM2), used through
the official openai package: the same answers as a worker gives directly, streams, the API key
passed through, merged /v1/models and per-worker /metrics."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest
from router_helpers import ENGINE_ARGS, ServerProcess, free_port, http_get, metric, start_router

API_KEY = "router-test-key"


@pytest.fixture(scope="module")
def workers():
    """Two servers, started one after the other (each loads the model)."""
    started = []
    try:
        for _ in range(2):
            command = ["-m", "fastdeploy", "serve", *ENGINE_ARGS, "--api-key", API_KEY]
            started.append(ServerProcess(command, free_port()))
        yield started
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture(scope="module")
def router(workers):
    process = start_router([worker.url for worker in workers], "--policy", "least-outstanding")
    yield process
    assert process.stop(10) == 0, process.output()


def client_for(url: str, api_key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(router):
    return client_for(router.url)


@pytest.fixture(scope="module")
def direct(workers):
    """A client of the first worker itself: the reference the router's answers must match."""
    return client_for(workers[0].url)


def model_id(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_completions_through_the_router_match_the_worker_directly(client, direct):
    model = model_id(direct)
    prompt = "The capital of France is"
    expected = direct.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    for _ in range(2):  # least-outstanding sends the two to different workers
        answer = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
        assert answer.choices[0].text == expected.choices[0].text
        assert answer.usage.completion_tokens == expected.usage.completion_tokens


def test_chat_through_the_router_matches_the_worker_directly(client, direct):
    model = model_id(direct)
    messages = [{"role": "user", "content": "Name a colour."}]
    expected = direct.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    assert answer.choices[0].message.content == expected.choices[0].message.content


def test_a_stream_through_the_router_carries_the_same_chunks(client, direct):
    model = model_id(direct)
    request = {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
    }
    expected = [chunk.choices[0].text for chunk in direct.completions.create(**request) if chunk.choices]
    relayed = [chunk.choices[0].text for chunk in client.completions.create(**request) if chunk.choices]
    # a busy worker may put two tokens in one chunk, so the boundaries differ run to run; the text
    # may not, and it comes in pieces (test_router_streaming.py shows each chunk passes on alone)
    assert "".join(relayed) == "".join(expected)
    assert len(relayed) > 1


def test_a_chat_stream_through_the_router(client, direct):
    model = model_id(direct)
    request = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6}
    expected = direct.chat.completions.create(**request, temperature=0).choices[0].message.content
    chunks = client.chat.completions.create(**request, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == expected


def test_the_clients_api_key_goes_to_the_worker(router, direct):
    model = model_id(direct)
    with pytest.raises(openai.AuthenticationError):
        client_for(router.url, api_key="wrong").completions.create(model=model, prompt="x", max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        client_for(router.url, api_key="wrong").models.list()


def test_models_are_merged_without_duplicates(client, direct):
    assert [m.id for m in client.models.list().data] == [m.id for m in direct.models.list().data]


def test_requests_spread_over_both_workers_and_metrics_show_each_and_the_total(
    router, workers, client, direct
):
    model = model_id(direct)
    before = http_get(router.url + "/metrics")[1]

    def served(worker: ServerProcess, text: str) -> float:
        try:
            return metric(text, "fastdeploy:router_requests_total", outcome="ok", worker=worker.url)
        except AssertionError:
            return 0.0

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: client.completions.create(model=model, prompt="Hi", max_tokens=4), range(8)))
    text = http_get(router.url + "/metrics")[1]
    counts = [served(worker, text) - served(worker, before) for worker in workers]
    assert sum(counts) == 8 and min(counts) >= 1, counts
    own = [metric(worker.metrics(), "fastdeploy:requests_number_total") for worker in workers]
    for worker, count in zip(workers, own, strict=True):
        assert metric(text, "fastdeploy:requests_number_total", worker=worker.url) == pytest.approx(
            count, abs=2
        )
    total = metric(text, "fastdeploy:requests_number_total", worker="total")
    labelled = [metric(text, "fastdeploy:requests_number_total", worker=w.url) for w in workers]
    assert total == sum(labelled)
