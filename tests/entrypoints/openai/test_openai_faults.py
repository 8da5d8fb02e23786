"""Faults inside a real `fastdeploy serve` process fail only the requests they touch.

The server runs on the test-only `faulty` device and `faulty` reasoning parser (tests/fault_injection),
found through the plugin's entry point in the server's PYTHONPATH. Victims (a prompt that makes an
op raise, one that makes its logits NaN, one whose answer makes the parser raise mid-stream) run
together with bystanders; each victim gets a 500 in OpenAI's shape, or an error event and
`[DONE]` if it streams, the bystanders get exactly the plain engine's answers, /health stays 200,
and /metrics counts each error by kind. A device that dies takes the process down with status 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from openai_server_helpers import HOST, ServerProcess, free_port, http_get, metric

from fastdeploy import SamplingParams

MODEL = "SmolLM2-135M-Instruct"
RAISE_TOKEN, NAN_TOKEN, DEAD_TOKEN = 49100, 49101, 49102
ENGINE = ["--max-model-len=1024", "--max-num-seqs=32"]
BYSTANDERS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at"]
PARSER_VICTIM = "Write a short poem about the sea."
MAX_TOKENS = 12


def plugin_env(fault_plugin_dir: str, **settings: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (fault_plugin_dir, os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **settings}


@pytest.fixture(scope="module")
def answers(llm) -> dict[str, str]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = [*BYSTANDERS, PARSER_VICTIM]
    return {
        prompt: o.outputs.text
        for prompt, o in zip(prompts, llm.generate(prompts, params, use_tqdm=False), strict=True)
    }


@pytest.fixture(scope="module")
def trigger(answers) -> str:
    """A word the parser victim's answer writes after its first tokens, and no bystander's does."""
    others = [answers[prompt] for prompt in BYSTANDERS]
    words = answers[PARSER_VICTIM].split()
    return next(w for w in words[1:] if len(w) > 2 and not any(w in text for text in others))


@pytest.fixture(scope="module")
def faulty_server(fault_plugin_dir, trigger):
    env = plugin_env(
        fault_plugin_dir,
        FD_FAULT_RAISE_TOKEN=str(RAISE_TOKEN),
        FD_FAULT_NAN_TOKEN=str(NAN_TOKEN),
        FD_FAULT_PARSER_TRIGGER=trigger,
    )
    command = ["-m", "fastdeploy", "serve", "--device=faulty", "--reasoning-parser=faulty", *ENGINE]
    process = ServerProcess(command, free_port(), env=env)
    yield process
    process.stop()


def victim_ids(llm, marker: int) -> list[int]:
    tokenizer = llm.get_tokenizer()
    return [*tokenizer.encode("Tell me about"), marker, *tokenizer.encode(" please")]


def completion(prompt, **fields) -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        **fields,
    }


def sse_events(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def sdk_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def sdk_completion(prompt, **fields) -> dict:
    """`completion(prompt)` as openai SDK arguments (our extra fields go in extra_body)."""
    payload = completion(prompt, **fields)
    extra = {"ignore_eos": payload.pop("ignore_eos")}
    return {**payload, "extra_body": extra}


def test_each_fault_fails_only_its_request(faulty_server, llm, answers):
    """Victims and bystanders at once: raw HTTP where the wire matters ([DONE] after the error
    event), the openai SDK where a user's code would see the outcome."""
    url = faulty_server.url
    client = sdk_client(url)
    results: dict[str, object] = {}

    def sdk_call(name: str, prompt, stream: bool) -> None:
        text = ""
        try:
            if stream:
                for chunk in client.completions.create(**sdk_completion(prompt), stream=True):
                    text += "".join(choice.text for choice in chunk.choices)
            else:
                text = client.completions.create(**sdk_completion(prompt)).choices[0].text
        except openai.APIError as exc:
            results[name] = (exc, text)
            return
        results[name] = text

    def raw_stream(name: str, payload: dict) -> None:
        with httpx.stream(
            "POST", url + "/v1/completions", json={**payload, "stream": True}, timeout=300
        ) as r:
            results[name] = (r.status_code, sse_events(r))

    jobs = [
        threading.Thread(target=sdk_call, args=("raise", victim_ids(llm, RAISE_TOKEN), False)),
        threading.Thread(target=raw_stream, args=("nan", completion(victim_ids(llm, NAN_TOKEN)))),
        threading.Thread(target=raw_stream, args=("parser", completion(PARSER_VICTIM))),
        threading.Thread(target=sdk_call, args=("parser-sdk", PARSER_VICTIM, True)),
        *(threading.Thread(target=sdk_call, args=(p, p, True)) for p in BYSTANDERS[:2]),
        *(threading.Thread(target=sdk_call, args=(p, p, False)) for p in BYSTANDERS[2:]),
    ]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(600)

    raised, _ = results["raise"]
    assert isinstance(raised, openai.InternalServerError) and raised.status_code == 500
    error = raised.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "forward_error" and error["type"] == "internal_server_error"
    assert "embedding op raised" in error["message"]

    for name, kind in (("nan", "nonfinite_logits"), ("parser", "output_processing")):
        status, events = results[name]
        assert status == 200 and events[-1] == "[DONE]", events
        failure = json.loads(events[-2])["error"]
        assert failure["code"] == kind, failure
        assert not any("error" in json.loads(e) for e in events[:-2])
    # the parser failed mid-stream: text had been sent before the error event
    status, events = results["parser"]
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-2] if json.loads(e)["choices"])
    # an SDK user sees the text so far, then an APIError carrying the error's code
    failure, text_so_far = results["parser-sdk"]
    assert type(failure) is openai.APIError and failure.code == "output_processing"
    assert text_so_far and answers[PARSER_VICTIM].startswith(text_so_far)

    for prompt in BYSTANDERS:
        assert results[prompt] == answers[prompt]

    assert http_get(url + "/health") == (200, '{"status":"ok"}')
    text = faulty_server.metrics()
    counts = {"forward_error": 1, "nonfinite_logits": 1, "output_processing": 2}
    for kind, count in counts.items():
        assert metric(text, "fastdeploy:request_errors_total", kind=kind) == count
    assert metric(text, "fastdeploy:available_gpu_block_num") == metric(
        text, "fastdeploy:gpu_total_block_num"
    )


def test_a_dead_device_fails_everything_and_the_process_exits_1(fault_plugin_dir, llm):
    env = plugin_env(fault_plugin_dir, FD_FAULT_DEAD_TOKEN=str(DEAD_TOKEN))
    server = ServerProcess(["-m", "fastdeploy", "serve", "--device=faulty", *ENGINE], free_port(), env=env)
    try:
        with httpx.stream(
            "POST",
            server.url + "/v1/completions",
            json=completion(BYSTANDERS[0], max_tokens=500, stream=True),
            timeout=300,
        ) as bystander:
            lines = bystander.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            killer = httpx.post(
                server.url + "/v1/completions", json=completion(victim_ids(llm, DEAD_TOKEN)), timeout=300
            )
            events = [first[6:], *(line[6:] for line in lines if line.startswith("data: "))]
        assert killer.status_code == 503 and killer.json()["error"]["code"] == "engine_dead"
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "engine_dead"
        assert health_fails(server)
        assert server.process.wait(120) == 1
        log = server.output()
        assert "probe pass failed too" in log and "shutting the server down" in log
    finally:
        server.stop()


def health_fails(server: ServerProcess) -> bool:
    """/health answers 503 `dead`, or nothing at all any more (the server is exiting)."""
    try:
        status, body = http_get(server.url + "/health")
    except OSError:
        return True
    return status == 503 and json.loads(body)["status"] == "dead"


def test_kv_cache_allocation_failure_at_start_exits_non_zero(fault_plugin_dir):
    env = {**os.environ, **plugin_env(fault_plugin_dir, FD_FAULT_KV_ALLOCATION="fail")}
    port = free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastdeploy",
            "serve",
            "--device=faulty",
            *ENGINE,
            "--host",
            HOST,
            "--port",
            str(port),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2
    assert "could not allocate the KV cache" in done.stderr and "MemoryError" in done.stderr
    assert "Traceback" not in done.stderr
