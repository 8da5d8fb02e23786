"""Prefill/decode disaggregation across hosts made here: the client, the router, two prefill and two
decode `fastdeploy serve` instances, each in a network namespace of its own joined by veth pairs
and reached over its own address. The router's host forwards between its links, so a prefill host
reaches a decode host's KV port through it, as across a switch.

    client 10.232.1.2 --- 10.232.1.1 router 10.232.2.1 --- 10.232.2.2 prefill pa
                                            10.232.3.1 --- 10.232.3.2 prefill pb
                                            10.232.4.1 --- 10.232.4.2 decode da
                                            10.232.5.1 --- 10.232.5.2 decode db

Checked: greedy output equals one mixed instance's (the embedded model in this process), blocks
a decode host holds are not sent again, a stalled transfer fails its request alone, a decode
host killed mid-stream ends that stream with an error and [DONE] while new requests avoid it, a
killed prefill host's requests go to the other, and no KV block stays held on any host.
"""

from __future__ import annotations

import json
import subprocess
import threading

import openai
import pytest
from netns_hosts import NETNS_SKIPS, Hosts, status_of, text_of
from router_helpers import http_post, metric

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_resolver import DEFAULT_MODEL

pytestmark = NETNS_SKIPS

PORT, KV_PORT, BLOCK = 8000, 7000, 16
ROUTER = "http://10.232.1.1:8080"
PREFILL = {"pa": "10.232.2.2", "pb": "10.232.3.2"}
DECODE = {"da": "10.232.4.2", "db": "10.232.5.2"}
SERVE = ["--max-model-len", "1024", "--max-num-seqs", "4", "--block-size", str(BLOCK)]
STORY = (
    "Once upon a time, in a village at the edge of a great forest, there lived an old clockmaker who "
    "repaired every clock in the valley. One winter morning a stranger knocked at his door"
)


def url(address: str) -> str:
    return f"http://{address}:{PORT}"


@pytest.fixture(scope="module")
def reference():
    """One mixed instance: the embedded model in this process."""
    return LLM(max_model_len=1024, max_num_seqs=4, block_size=BLOCK)


@pytest.fixture(scope="module")
def hosts():
    hosts = Hosts(["client", "router", *PREFILL, *DECODE], "fdd")
    try:
        links = [("client", "10.232.1.2", "router", "10.232.1.1")]
        for index, (role, address) in enumerate({**PREFILL, **DECODE}.items(), start=2):
            links.append(("router", f"10.232.{index}.1", role, address))
        try:
            hosts.create(links)
            hosts.forward("router")
            for index, role in enumerate([*PREFILL, *DECODE], start=2):
                hosts.route_via(role, f"10.232.{index}.1")
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
        for role, address in PREFILL.items():
            serve = [*SERVE, "--splitwise-role", "prefill", "--kv-transfer-timeout", "5"]
            hosts.start(role, ["-m", "fastdeploy", "serve", *serve, "--host", address, "--port", str(PORT)])
        for role, address in DECODE.items():
            serve = [*SERVE, "--splitwise-role", "decode", "--kv-transfer-port", str(KV_PORT)]
            hosts.start(role, ["-m", "fastdeploy", "serve", *serve, "--host", address, "--port", str(PORT)])
        # every worker healthy before the router starts: it checks them again only every 30 s
        for role, address in {**PREFILL, **DECODE}.items():
            hosts.wait_healthy(role, url(address), via="router")
        router = ["-m", "fastdeploy", "router", "--host", "10.232.1.1", "--port", "8080"]
        router += ["--startup-timeout", "300", "--health-interval", "30", "--policy", "prefix-affinity"]
        router += [
            "--prefill-workers",
            *map(url, PREFILL.values()),
            "--decode-workers",
            *map(url, DECODE.values()),
        ]
        hosts.start("router", router)
        hosts.wait_healthy("router", ROUTER)
        for address in {**PREFILL, **DECODE}.values():  # the client reaches them only through the router
            assert hosts.from_client(status_of, url(address) + "/health") == 0
        yield hosts
    finally:
        hosts.remove()


def completion(prompt: str, max_tokens: int = 16, **extra):
    client = openai.OpenAI(base_url=ROUTER + "/v1", api_key="unused", max_retries=0, timeout=120)
    return client.completions.create(
        model=DEFAULT_MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, **extra
    )


def info(hosts: Hosts, address: str) -> dict:
    """A worker's /v1/disaggregation, asked from the router's host."""
    return json.loads(hosts.run_in("router", text_of, url(address) + "/v1/disaggregation"))


def received(hosts: Hosts) -> int:
    return sum(info(hosts, address)["kv_blocks"]["received"] for address in DECODE.values())


def expected_text(reference: LLM, prompt: str, max_tokens: int = 16) -> str:
    # the server lays a request's fields over the model's generation defaults; so does this
    params = SamplingParams(
        **{**reference.llm_engine.generation_defaults, "max_tokens": max_tokens, "temperature": 0}
    )
    (output,) = reference.generate([prompt], params)
    return output.outputs[0].text


def test_greedy_output_is_the_mixed_instances_and_the_prompt_travelled(hosts, reference):
    before = received(hosts)
    answer = hosts.from_client(completion, STORY)
    assert answer.choices[0].text == expected_text(reference, STORY)
    whole, tail = divmod(answer.usage.prompt_tokens - 1, BLOCK)  # the tokens before the last one
    # they all travelled, a partial block too: the decode host computed only the last token
    assert whole >= 2 and received(hosts) - before == whole + (tail > 0)
    streamed = hosts.from_client(
        lambda: "".join(c.choices[0].text for c in completion(STORY + " and said", stream=True) if c.choices)
    )
    assert streamed == expected_text(reference, STORY + " and said")


def test_blocks_the_decode_host_holds_are_not_sent_again(hosts, reference):
    tokenizer = reference.llm_engine.tokenizer
    first = STORY + " The stranger carried a broken pocket watch that had belonged to a queen."
    second = STORY + " Inside the shop, hundreds of clocks ticked together like rain."
    hosts.from_client(completion, first, 4)
    before = received(hosts)
    answer = hosts.from_client(completion, second, 4)  # prefix affinity: the same decode host
    assert answer.choices[0].text == expected_text(reference, second, 4)
    a, b = tokenizer.encode(first), tokenizer.encode(second)
    assert answer.usage.prompt_tokens == len(b)
    shared = 0
    while (shared + 1) * BLOCK <= min(len(a), len(b) - 1) and a[: (shared + 1) * BLOCK] == b[
        : (shared + 1) * BLOCK
    ]:
        shared += 1
    assert shared >= 2
    assert received(hosts) - before == -(-(len(b) - 1) // BLOCK) - shared  # a partial block too


def test_a_stalled_transfer_fails_its_request_alone(hosts, reference):
    zmq = pytest.importorskip("zmq")
    sockets = {}

    def listen_silently() -> int:  # on the router's host: a KV port that never answers
        sockets["context"] = zmq.Context()
        sockets["silent"] = sockets["context"].socket(zmq.ROUTER)
        return sockets["silent"].bind_to_random_port("tcp://10.232.2.1")

    def close() -> None:
        sockets["silent"].close(linger=0)
        sockets["context"].term()

    port = hosts.run_in("router", listen_silently)
    stalled: dict = {}

    def prefill_to_nowhere() -> None:
        request = {
            "prompt": STORY,
            "max_tokens": 1,
            "kv_transfer_params": {"decode_address": f"10.232.2.1:{port}"},
        }
        stalled["answer"] = hosts.run_in("router", http_post, url(PREFILL["pa"]) + "/v1/completions", request)

    thread = threading.Thread(target=prefill_to_nowhere)
    thread.start()
    try:
        for prompt in ("The weather today", "A recipe for bread"):  # served meanwhile, pa included
            assert hosts.from_client(completion, prompt).choices[0].text == expected_text(reference, prompt)
        thread.join(timeout=120)
        status, body = stalled["answer"]
        assert status == 504 and "stalled: no answer within 5 s" in body["error"]["message"]
    finally:
        thread.join(timeout=120)
        hosts.run_in("router", close)
    assert_nothing_held(hosts, PREFILL.values())


def assert_nothing_held(hosts: Hosts, addresses) -> None:
    """Every KV block free again (received blocks a request took are let go at its first pass)."""
    for address in addresses:
        state = info(hosts, address)
        assert state["kv_blocks"]["free"] == state["kv_blocks"]["total"], (address, state)
        assert state["kv_blocks"].get("held", 0) == 0 and state.get("transfers_in_flight", 0) == 0, state


def test_a_decode_host_killed_mid_stream_ends_the_stream_and_new_requests_avoid_it(hosts, reference):
    def stream_until_killed() -> tuple[str, list[str]]:
        stream = completion("Tell me a long story.", 1000, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks)
        metrics = text_of(ROUTER + "/metrics")
        busy = [
            role
            for role, address in DECODE.items()
            if metric(metrics, "fastdeploy:router_outstanding_requests", worker=url(address)) == 1
        ]
        assert len(busy) == 1, metrics
        hosts.kill(busy[0])
        try:
            return busy[0], [chunk.choices[0].text for chunk in chunks if chunk.choices]
        except openai.APIError as exc:
            return busy[0], [f"error: {exc.message}"]

    killed, rest = hosts.from_client(stream_until_killed)
    assert rest and rest[-1].startswith("error: the worker serving this stream failed"), rest
    for prompt in ("Hello", "The capital of France is"):
        assert hosts.from_client(completion, prompt).choices[0].text == expected_text(reference, prompt)
    health = json.loads(hosts.from_client(text_of, ROUTER + "/health"))["workers"]
    assert health[url(DECODE[killed])] == "unhealthy"
    survivor = next(address for role, address in DECODE.items() if role != killed)
    assert_nothing_held(hosts, [*PREFILL.values(), survivor])


def test_a_killed_prefill_hosts_requests_go_to_the_other(hosts, reference):
    hosts.kill("pa")
    for prompt in ("Water boils at", "My favourite colour is", "The first month of the year is"):
        assert hosts.from_client(completion, prompt).choices[0].text == expected_text(reference, prompt)
    metrics = hosts.from_client(text_of, ROUTER + "/metrics")
    assert metric(metrics, "fastdeploy:router_retries_total", worker=url(PREFILL["pa"])) >= 1
    assert_nothing_held(hosts, [PREFILL["pb"]])
