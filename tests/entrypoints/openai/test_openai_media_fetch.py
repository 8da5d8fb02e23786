"""The server is not a proxy into its network: ERNIE-4.5-VL behind the OpenAI server, chat requests
whose image_url parts point at servers these tests start (counting every connection they accept).

By default every private destination, in any spelling, answers the same 400 and is never
connected to; with --media-allow-private-networks a loopback PNG works end to end (same answer
as the same PNG inline) and redirects are followed up to 3 hops; every failure reads the same,
byte for byte; 20 requests stuck on a media host that never answers leave /health and text chats
answering within a second.
"""

from __future__ import annotations

import base64
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn
from openai_server_helpers import HOST, free_port, wait_until

pytest.importorskip("PIL")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "input"))
import tiny_vl_checkpoint as tiny  # noqa: E402
from media_servers import PNG, MediaServer, SilentServer, closed_port, private_namespace  # noqa: E402

from fastdeploy.entrypoints.openai.api_server import build_context  # noqa: E402
from fastdeploy.entrypoints.openai.app import build_app  # noqa: E402
from fastdeploy.entrypoints.openai.cli_args import build_parser  # noqa: E402
from fastdeploy.entrypoints.openai.serving import PREPROCESS_THREADS  # noqa: E402
from fastdeploy.input.ernie_templates import ERNIE_4_5_VL_CHAT_TEMPLATE  # noqa: E402
from fastdeploy.input.media_fetch import MAX_FETCHES_IN_FLIGHT  # noqa: E402

UNIFORM = "message 0 content part 0: could not fetch the media URL"


def image_message(url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "Describe it."},
            ],
        }
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ernie-vl-media")
    tiny.write_checkpoint(directory, "pt", tiny.CHAT_CONFIG)
    tiny.write_vl_tokenizer(directory, ERNIE_4_5_VL_CHAT_TEMPLATE)
    return directory


def _serve(checkpoint, *flags: str):
    args = build_parser("test").parse_args(
        [
            "--model", str(checkpoint), "--max-model-len", "512",
            "--limit-mm-per-prompt", '{"image": 2}', "--mm-processor-kwargs", '{"image_max_pixels": 50176}',
            *flags,
        ]
    )  # fmt: skip
    ctx = build_context(args)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(ctx), host=HOST, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 120, "the in-process server")
    return server, thread, f"http://{HOST}:{port}"


@pytest.fixture(scope="module")
def default_server(checkpoint):
    server, thread, url = _serve(checkpoint)
    yield url
    server.should_exit = True
    thread.join(60)


@pytest.fixture(scope="module")
def private_ok_server(checkpoint):
    server, thread, url = _serve(checkpoint, "--media-allow-private-networks")
    yield url
    server.should_exit = True
    thread.join(60)


@pytest.fixture
def media():
    server = MediaServer()
    yield server
    server.close()


def chat(base: str, url: str, timeout: float = 120, **fields) -> httpx.Response:
    body = {"messages": image_message(url), "max_tokens": 4, "temperature": 0, **fields}
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=timeout)


def assert_uniform(response: httpx.Response) -> bytes:
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == UNIFORM
    return response.content


def test_private_destinations_in_every_spelling_get_the_uniform_400_and_no_request(default_server, media):
    port = media.port
    urls = [
        f"http://127.0.0.1:{port}/image.png",
        f"http://2130706433:{port}/image.png",
        f"http://0x7f000001:{port}/image.png",
        f"http://0177.0.0.1:{port}/image.png",
        f"http://[::ffff:127.0.0.1]:{port}/image.png",
        f"http://localhost:{port}/image.png",
        f"http://[::1]:{port}/image.png",
    ]
    bodies = {assert_uniform(chat(default_server, url)) for url in urls}
    assert len(bodies) == 1
    assert media.connections == 0


def test_private_and_link_local_addresses_of_our_namespace(default_server, private_ok_server, tmp_path):
    with private_namespace(tmp_path) as (addresses, port, connections):
        for address in addresses:
            assert_uniform(chat(default_server, f"http://{address}:{port}/image.png"))
        assert connections() == 0
        for address in addresses:  # the servers are there, and reachable when the operator allows it
            assert chat(private_ok_server, f"http://{address}:{port}/image.png").status_code == 200
        assert connections() == len(addresses)


def test_open_and_closed_ports_answer_byte_identical_bodies(default_server, private_ok_server, media):
    open_url = f"http://127.0.0.1:{media.port}/image.png"
    closed_url = f"http://127.0.0.1:{closed_port()}/image.png"
    assert assert_uniform(chat(default_server, open_url)) == assert_uniform(chat(default_server, closed_url))
    assert media.connections == 0
    # allowed to connect, an open port serving text and a closed one still read the same
    not_an_image = assert_uniform(chat(private_ok_server, f"http://127.0.0.1:{media.port}/text"))
    assert not_an_image == assert_uniform(chat(private_ok_server, closed_url))


def test_a_loopback_png_works_end_to_end_when_private_networks_are_allowed(private_ok_server, media):
    inline = chat(private_ok_server, "data:image/png;base64," + base64.b64encode(PNG).decode())
    fetched = chat(private_ok_server, f"http://127.0.0.1:{media.port}/image.png")
    redirected = chat(private_ok_server, f"http://localhost:{media.port}/hop3")
    for response in (inline, fetched, redirected):
        assert response.status_code == 200, response.text
    reference = inline.json()
    for response in (fetched, redirected):  # the same pixels: the same prompt and greedy answer
        assert response.json()["usage"]["prompt_tokens"] == reference["usage"]["prompt_tokens"]
        assert response.json()["choices"][0]["message"] == reference["choices"][0]["message"]
    assert media.paths == ["/image.png", "/hop3", "/hop2", "/hop1", "/image.png"]
    media.paths.clear()
    assert_uniform(chat(private_ok_server, f"http://localhost:{media.port}/hop4"))
    assert media.paths == ["/hop4", "/hop3", "/hop2", "/hop1"]


@pytest.mark.parametrize(
    "path",
    [
        "http://user:pass@127.0.0.1:{port}/image.png",
        "ftp://127.0.0.1:{port}/image.png",
        "gopher://127.0.0.1:{port}/_GET%20/",
        "http://127.0.0.1:{port}/big-header",
        "http://127.0.0.1:{port}/huge-length",
        "http://127.0.0.1:{port}/growing",
    ],
)
def test_bad_input_gets_the_same_400_and_never_reaches_a_private_destination(
    default_server, private_ok_server, media, path
):
    url = path.format(port=media.port)
    reference = assert_uniform(chat(default_server, f"http://127.0.0.1:{closed_port()}/x.png"))
    assert assert_uniform(chat(default_server, url)) == reference
    assert media.connections == 0
    # where loopback may be fetched, the answer is the same: credentials and schemes are refused
    # before connecting, the others once the header, length or body outgrows its cap
    assert assert_uniform(chat(private_ok_server, url)) == reference
    assert media.connections == (1 if url.startswith("http://127") else 0)


def test_media_hosts_that_never_answer_hold_neither_health_nor_text_chats(private_ok_server):
    text = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert httpx.post(private_ok_server + "/v1/chat/completions", json=text, timeout=120).status_code == 200
    silent = SilentServer()
    url = f"http://127.0.0.1:{silent.port}/image.png"
    pool = ThreadPoolExecutor(20)
    try:
        stuck = [pool.submit(chat, private_ok_server, url, 60) for _ in range(20)]
        # more stuck fetches than the server has preprocessing threads
        wait_until(lambda: silent.connections > PREPROCESS_THREADS, 30, "the stuck fetches to connect")
        for _ in range(3):
            assert httpx.get(private_ok_server + "/health", timeout=1).status_code == 200
            reply = httpx.post(private_ok_server + "/v1/chat/completions", json=text, timeout=1)
            assert reply.status_code == 200, reply.text
        wait_until(lambda: silent.connections >= MAX_FETCHES_IN_FLIGHT, 30, "the fetches in flight")
        assert silent.connections == MAX_FETCHES_IN_FLIGHT  # the other 4 wait for a slot
        assert not any(future.done() for future in stuck)
    finally:
        silent.close()  # the stuck fetches fail now, with the uniform answer
        responses = [future.result(timeout=60) for future in stuck]
        pool.shutdown()
    for response in responses:
        assert_uniform(response)


def test_completions_multimodal_data_urls_follow_the_same_rules(default_server, private_ok_server, media):
    def complete(base: str, url: str) -> httpx.Response:
        prompt = {"prompt": "<|image@placeholder|>Describe it.", "multimodal_data": {"image": [url]}}
        return httpx.post(base + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=120)

    url = f"http://127.0.0.1:{media.port}/image.png"
    refused = complete(default_server, url)
    assert refused.status_code == 400
    assert (
        refused.json()["error"]["message"]
        == "prompt 0: multimodal_data image 0: could not fetch the media URL"
    )
    assert media.connections == 0
    assert complete(private_ok_server, url).status_code == 200
    assert media.paths == ["/image.png"]


def test_responses_input_images_follow_the_same_rules(default_server, private_ok_server, media):
    """An `input_image` of the Responses API is fetched by the chat path's rules: refused towards a
    private address by default (never connected to), and where allowed the same greedy answer as
    the chat request with the same image."""

    def respond(base: str, url: str, **fields) -> httpx.Response:
        content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "Describe it."}]
        body = {
            "input": [{"role": "user", "content": content}],
            "max_output_tokens": 4,
            "temperature": 0,
            **fields,
        }
        return httpx.post(base + "/v1/responses", json=body, timeout=120)

    url = f"http://127.0.0.1:{media.port}/image.png"
    refused = respond(default_server, url, instructions="Be brief.")  # the system message comes first
    assert refused.status_code == 400  # the chat path's uniform answer, naming the input item's part
    assert refused.json()["error"]["message"] == "input[0].content[0]: could not fetch the media URL"
    assert refused.json()["error"]["param"] == "input" and media.connections == 0
    answered = respond(private_ok_server, url)
    assert answered.status_code == 200, answered.text
    expected = chat(private_ok_server, url).json()
    assert answered.json()["usage"]["input_tokens"] == expected["usage"]["prompt_tokens"]
    text = answered.json()["output"][0]["content"][0]["text"]
    assert text == expected["choices"][0]["message"]["content"]
