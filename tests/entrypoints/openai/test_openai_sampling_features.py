"""Decoding features over HTTP: prompt logprobs (`echo` + `logprobs`, vLLM's `prompt_logprobs`),
`best_of`, beam search, and a server started with `--speculative-config` (its /metrics).

The prompt logprobs are checked against transformers' log-softmax
(tests/fixtures/decoding_references.json, tools/make_decoding_references.py); generated tokens
against the offline `LLM` with the same settings.
"""

from __future__ import annotations

import json
import os

import pytest
from openai_server_helpers import ENGINE_ARGS, ServerProcess, free_port, http_post, metric

from fastdeploy import SamplingParams
from fastdeploy.entrypoints.openai.params import chat_sampling_params, completion_sampling_params
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

MODEL = "SmolLM2-135M-Instruct"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def case() -> dict:
    path = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "decoding_references.json")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["models"][MODEL]["prompt_logprobs"][0]


def test_echo_with_logprobs_returns_the_prompts_logprobs_first(client, llm, case):
    ids = case["prompt_token_ids"]
    tokenizer = llm.get_tokenizer()
    (expected,) = llm.generate(
        {"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=3, logprobs=2), use_tqdm=False
    )
    response = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=3, temperature=0, echo=True, logprobs=2
    )
    (choice,) = response.choices
    logprobs = choice.logprobs
    prompt_text = tokenizer.decode(ids, skip_special_tokens=False)
    assert choice.text == prompt_text + expected.outputs.text
    assert logprobs.tokens == [
        tokenizer.decode([t], skip_special_tokens=False) for t in ids + expected.outputs.token_ids
    ]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for position, reference in enumerate(case["positions"], start=1):
        assert logprobs.token_logprobs[position] == pytest.approx(reference["logprob"], abs=TOLERANCE)
        top = logprobs.top_logprobs[position]
        best = {tokenizer.decode([t], skip_special_tokens=False): v for t, v in reference["top"][:2]}
        for text, value in best.items():
            assert top[text] == pytest.approx(value, abs=TOLERANCE)
        assert len(top) <= 3
    generated = logprobs.token_logprobs[len(ids) :]
    for value, token, entry in zip(
        generated, expected.outputs.token_ids, expected.outputs.logprobs, strict=True
    ):
        assert value == pytest.approx(entry[token], abs=1e-5)
    offsets = logprobs.text_offset
    assert offsets[0] == 0 and offsets[len(ids)] == len(prompt_text)
    assert all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], logprobs.tokens, strict=False))


def test_echo_with_logprobs_streams_the_prompt_in_the_first_chunk(client, case):
    ids = case["prompt_token_ids"]
    kwargs = {"model": MODEL, "prompt": ids, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1}
    whole = client.completions.create(**kwargs).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**kwargs, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text
    streamed = [value for c in chunks if c.logprobs for value in c.logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(whole.logprobs.token_logprobs[1:], abs=1e-6)
    offsets = [value for c in chunks if c.logprobs for value in c.logprobs.text_offset]
    assert offsets == whole.logprobs.text_offset


def test_prompt_logprobs_field_as_vllm_sends_it(server, case):
    ids = case["prompt_token_ids"]
    status, body = http_post(
        server.url + "/v1/completions",
        {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2},
    )
    assert status == 200, body
    field = body["choices"][0]["prompt_logprobs"]
    assert len(field) == len(ids) and field[0] is None
    for entry, reference in zip(field[1:], case["positions"], strict=True):
        own = entry[str(reference["token"])]
        assert own["logprob"] == pytest.approx(reference["logprob"], abs=TOLERANCE)
        for rank, (token, value) in enumerate(reference["top"][:2], start=1):
            assert entry[str(token)]["rank"] == rank
            assert entry[str(token)]["logprob"] == pytest.approx(value, abs=TOLERANCE)
        assert own["rank"] in (1, 2, None) and isinstance(own["decoded_token"], str)
    status, body = http_post(
        server.url + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "prompt_logprobs": 0,
        },
    )
    assert status == 200, body
    field = body["prompt_logprobs"]
    assert field[0] is None and all(len(entry) == 1 for entry in field[1:])


@pytest.mark.parametrize(
    ("payload", "param", "fragment"),
    [
        ({"prompt_logprobs": 21}, "prompt_logprobs", "prompt_logprobs must be in [0, 20]"),
        ({"prompt_logprobs": -1}, "prompt_logprobs", "prompt_logprobs must be >= 0"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "cannot be streamed"),
        ({"echo": True, "logprobs": 21}, "logprobs", "logprobs must be in [0, 20]"),
    ],
)
def test_prompt_logprobs_refusals_name_the_field(server, payload, param, fragment):
    status, body = http_post(
        server.url + "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 1, **payload}
    )
    assert status == 400, body
    assert body["error"]["param"] == param and fragment in body["error"]["message"], body


def test_best_of_returns_the_offline_engines_best_samples(client, llm):
    settings = {"temperature": 1.0, "seed": 11, "max_tokens": 8}
    (expected,) = llm.generate(
        "The capital of France is", SamplingParams(n=2, best_of=4, **settings), use_tqdm=False
    )
    response = client.completions.create(
        model=MODEL, prompt="The capital of France is", n=2, extra_body={"best_of": 4}, **settings
    )
    assert [choice.text for choice in response.choices] == [sample.text for sample in expected.outputs]
    assert [choice.index for choice in response.choices] == [0, 1]


def test_beam_search_over_completions_and_chat(client, llm):
    params = SamplingParams(use_beam_search=True, temperature=0, n=2, best_of=3, max_tokens=8)
    beam = {"use_beam_search": True, "best_of": 3, "length_penalty": 1.0, "early_stopping": False}
    (expected,) = llm.generate("The capital of France is", params, use_tqdm=False)
    response = client.completions.create(
        model=MODEL, prompt="The capital of France is", n=2, temperature=0, max_tokens=8, extra_body=beam
    )
    assert [choice.text for choice in response.choices] == [sample.text for sample in expected.outputs]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    (expected,) = llm.chat(messages, params, use_tqdm=False)
    response = client.chat.completions.create(
        model=MODEL, messages=messages, n=2, temperature=0, max_tokens=8, extra_body=beam
    )
    assert [choice.message.content for choice in response.choices] == [s.text for s in expected.outputs]


def test_beam_requests_keep_beam_settings_under_the_checkpoints_sampling_defaults():
    """A checkpoint's generation_config.json (ERNIE-4.5: top_p 0.8) fills what a sampled request
    omits; a beam request takes only its max_tokens: top_p 0.8 would refuse every beam request
    for a setting it never sent."""
    defaults = {"temperature": 0.8, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "max_tokens": 11}
    beam = {"use_beam_search": True, "temperature": 0, "n": 2}
    completion = completion_sampling_params(CompletionRequest(model=MODEL, prompt="x", **beam), defaults)
    messages = [{"role": "user", "content": "x"}]
    chat = chat_sampling_params(ChatCompletionRequest(model=MODEL, messages=messages, **beam), defaults)
    for params in (completion, chat):
        assert params.use_beam_search and params.max_tokens == 11
        assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0, 1, 0, 1)
    sampled = completion_sampling_params(CompletionRequest(model=MODEL, prompt="x", n=2), defaults)
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.repetition_penalty) == (
        0.8,
        0.8,
        20,
        1.05,
    )


@pytest.mark.parametrize(
    ("payload", "param", "fragment"),
    [
        ({"use_beam_search": True}, "temperature", "temperature must be 0.0 with use_beam_search=True"),
        (
            {"use_beam_search": True, "temperature": 0, "stream": True},
            "use_beam_search",
            "cannot be streamed",
        ),
        ({"n": 3, "best_of": 2}, "best_of", "best_of must be >= n (3), got 2"),
        ({"best_of": 3, "stream": True}, "best_of", "cannot be streamed"),
        ({"best_of": 99, "temperature": 1}, "best_of", "exceeds the engine's max_num_seqs (32)"),
        ({"length_penalty": 0.5}, "length_penalty", "only applies with use_beam_search=True"),
        (
            {"use_beam_search": True, "temperature": 0, "stop": ["."]},
            "stop",
            "not supported with use_beam_search",
        ),
    ],
)
def test_beam_and_best_of_refusals_name_the_field(server, payload, param, fragment):
    status, body = http_post(
        server.url + "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 2, **payload}
    )
    assert status == 400, body
    assert body["error"]["param"] == param and fragment in body["error"]["message"], body


#: a prompt whose continuation copies its input, so prompt lookup drafts are mostly right
GROUNDED = (
    "# config_loader.py\n"
    "def parse_config(path):\n"
    "    settings = {}\n"
    "    with open(path) as handle:\n"
    "        for line in handle:\n"
    "            key, value = line.strip().split('=', 1)\n"
    "            settings[key.strip()] = value.strip()\n"
    "    return settings\n\n"
    "# config_loader_v2.py: the same function, with settings renamed to config\n"
)


@pytest.fixture(scope="module")
def speculating_server():
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "max_ngram_size": 4, "min_ngram_size": 2}'
    process = ServerProcess(
        ["-m", "fastdeploy.entrypoints.openai.api_server", *ENGINE_ARGS, "--speculative-config", spec],
        free_port(),
    )
    yield process
    process.stop()


def test_speculating_server_answers_as_plain_decoding_and_reports_acceptance(speculating_server, llm):
    (expected,) = llm.generate(GROUNDED, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    status, body = http_post(
        speculating_server.url + "/v1/completions",
        {"model": MODEL, "prompt": GROUNDED, "max_tokens": 48, "temperature": 0},
    )
    assert status == 200, body
    assert body["choices"][0]["text"] == expected.outputs.text
    text = speculating_server.metrics()
    drafted = metric(text, "fastdeploy:spec_decode_num_draft_tokens_total")
    accepted = metric(text, "fastdeploy:spec_decode_num_accepted_tokens_total")
    steps = metric(text, "fastdeploy:spec_decode_num_verify_steps_total")
    assert drafted >= accepted > 0 and steps > 0
    assert metric(text, "fastdeploy:spec_decode_draft_acceptance_rate") == pytest.approx(accepted / drafted)
    assert metric(text, "fastdeploy:spec_decode_accepted_tokens_per_step") == pytest.approx(accepted / steps)
    emitted = metric(text, "fastdeploy:spec_decode_num_emitted_tokens_total")
    assert emitted == accepted + steps
