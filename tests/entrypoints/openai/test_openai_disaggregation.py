"""The server's side of prefill/decode disaggregation: chat answers through a prefill and a decode
server paired by the router equal the mixed server's, `kv_transfer_params` are refused where they
cannot act, and bad start-up settings are refused naming the flag."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from openai_server_helpers import ENGINE_ARGS, ServerProcess, free_port, http_get, http_post

from fastdeploy.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "router"))
from router_helpers import start_router  # noqa: E402

pytest.importorskip("zmq", reason="pyzmq is not installed (the disagg extra)")

CHAT = {
    "messages": [{"role": "user", "content": "Name three rivers in Europe and say one thing about each."}],
    "max_tokens": 24,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def pair():
    """A prefill and a decode server behind a router, on loopback."""
    started = []
    try:
        prefill = ServerProcess(
            ["-m", "fastdeploy", "serve", *ENGINE_ARGS, "--splitwise-role", "prefill"], free_port()
        )
        started.append(prefill)
        decode = ServerProcess(
            ["-m", "fastdeploy", "serve", *ENGINE_ARGS, "--splitwise-role", "decode"], free_port()
        )
        started.append(decode)
        router = start_router([], "--prefill-workers", prefill.url, "--decode-workers", decode.url)
        started.append(router)
        yield prefill, decode, router
    finally:
        for process in reversed(started):
            process.stop()


def test_a_chat_through_the_pair_answers_as_the_mixed_server(server, pair):
    prefill, decode, router = pair
    status, expected = http_post(server.url + "/v1/chat/completions", CHAT)
    assert status == 200
    status, answer = http_post(router.url + "/v1/chat/completions", CHAT)
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == expected["choices"][0]["message"]["content"]
    state = json.loads(http_get(decode.url + "/v1/disaggregation")[1])
    # every block before the prompt's last token travels, the partial last one too
    offered = -(-(answer["usage"]["prompt_tokens"] - 1) // state["kv_layout"]["block_size"])
    assert state["role"] == "decode" and state["kv_blocks"]["received"] == offered
    assert state["kv_blocks"]["held"] == 0 and state["kv_blocks"]["free"] == state["kv_blocks"]["total"]
    state = json.loads(http_get(prefill.url + "/v1/disaggregation")[1])
    assert state["role"] == "prefill" and state["transfers_in_flight"] == 0 and state["kv_port"] is None


def test_the_prefill_server_answers_with_what_it_sent(pair):
    prefill, decode, _ = pair
    port = json.loads(http_get(decode.url + "/v1/disaggregation")[1])["kv_port"]
    request = {**CHAT, "max_tokens": 1, "kv_transfer_params": {"decode_address": f"127.0.0.1:{port}"}}
    status, answer = http_post(prefill.url + "/v1/chat/completions", request)
    assert status == 200
    sent = answer["kv_transfer_params"]
    whole, tail = divmod(answer["usage"]["prompt_tokens"] - 1, 64)  # the default --block-size
    assert sent["blocks_held"] + sent["blocks_sent"] == whole + (tail > 0)
    # the test before sent this prompt to that decode server: its whole blocks are cached there,
    # a partial last block is not (it went to that request alone) and travels again
    assert sent["blocks_held"] == whole


def test_kv_transfer_params_are_refused_where_they_cannot_act(server, pair):
    prefill, _, _ = pair
    params = {"kv_transfer_params": {"decode_address": "127.0.0.1:1"}}
    status, body = http_post(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1, **params})
    assert status == 400 and body["error"]["param"] == "kv_transfer_params"
    assert "prefill instances" in body["error"]["message"]
    status, body = http_post(prefill.url + "/v1/completions", {"prompt": "hi", "stream": True, **params})
    assert status == 400 and body["error"]["param"] == "stream"
    bad = {"prompt": "hi", "kv_transfer_params": {"address": "x"}}
    status, body = http_post(prefill.url + "/v1/completions", bad)
    assert status == 400 and "decode_address" in body["error"]["message"]
    assert json.loads(http_get(server.url + "/v1/disaggregation")[1]) == {"role": "mixed"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--splitwise-role", "decode", "--no-enable-prefix-caching"], "--splitwise-role decode keeps"),
        (
            ["--splitwise-role", "prefill", "--kv-transport", "carrier-pigeon"],
            "--kv-transport 'carrier-pigeon'",
        ),
        (["--splitwise-role", "prefill", "--kv-transfer-timeout", "0"], "--kv-transfer-timeout must be > 0"),
    ],
)
def test_bad_disaggregation_settings_are_refused_at_start_up(capsys, flags, message):
    assert main(["serve", *ENGINE_ARGS, "--port", str(free_port()), *flags]) == 2
    assert message in capsys.readouterr().err
