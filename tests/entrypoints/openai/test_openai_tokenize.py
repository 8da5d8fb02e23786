"""`POST /tokenize` and `/detokenize` (vLLM's shapes) against the test server process: the ids
equal the offline tokenizer's and the ids `LLM.chat` queues, counts equal what chat requests
report as prompt tokens, and detokenizing gives the text back."""

from __future__ import annotations

import pytest
from openai_server_helpers import http_post

from fastdeploy import SamplingParams

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def post(server, path, payload):
    return http_post(server.url + path, payload)


def test_a_prompt_is_encoded_as_the_tokenizer_encodes_it(server, llm):
    tokenizer = llm.get_tokenizer()
    status, body = post(server, "/tokenize", {"model": MODEL, "prompt": PROMPT})
    assert status == 200
    assert body["tokens"] == tokenizer.encode(PROMPT) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 1024 and body["token_strs"] is None
    _, plain = post(server, "/tokenize", {"prompt": PROMPT, "add_special_tokens": False})
    assert plain["tokens"] == tokenizer.encode(PROMPT, add_special_tokens=False)


def test_messages_count_what_a_chat_request_queues(server, llm, client):
    (expected,) = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    status, body = post(server, "/tokenize", {"messages": CHAT})
    assert status == 200 and body["tokens"] == list(expected.prompt_token_ids)
    usage = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1, temperature=0).usage
    assert body["count"] == usage.prompt_tokens
    _, without = post(server, "/tokenize", {"messages": CHAT, "add_generation_prompt": False})
    assert without["count"] < body["count"] and body["tokens"][: without["count"]] == without["tokens"]


def test_detokenize_gives_the_text_back(server, llm):
    _, encoded = post(server, "/tokenize", {"prompt": PROMPT, "add_special_tokens": False})
    status, body = post(server, "/detokenize", {"model": MODEL, "tokens": encoded["tokens"]})
    assert status == 200 and body == {"prompt": PROMPT}
    _, conversation = post(server, "/tokenize", {"messages": CHAT})
    _, rendered = post(server, "/detokenize", {"tokens": conversation["tokens"]})
    expected = llm.get_tokenizer().apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered["prompt"] == expected and "<|im_start|>" in expected


def test_token_strs_and_a_prompt_longer_than_the_context(server, llm):
    status, body = post(server, "/tokenize", {"prompt": PROMPT, "return_token_strs": True})
    tokenizer = llm.get_tokenizer()
    assert status == 200 and len(body["token_strs"]) == body["count"]
    assert body["token_strs"] == [tokenizer.id_to_token(token) for token in tokenizer.encode(PROMPT)]
    status, long = post(server, "/tokenize", {"prompt": "word " * 2000})
    assert status == 200 and long["count"] > long["max_model_len"]  # counted, not refused


@pytest.mark.parametrize(
    ("path", "payload", "param", "fragment"),
    [
        ("/tokenize", {"prompt": "a", "messages": CHAT}, None, "either 'prompt'"),
        ("/tokenize", {}, None, "either 'prompt'"),
        ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages", "audio"),
        ("/tokenize", {"prompt": "a", "model": "other"}, "model", "other"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens", "tokens[1]"),
        ("/detokenize", {"tokens": [10**9]}, "tokens", "tokens[0]"),
        ("/detokenize", {"tokens": [True]}, "tokens", "integer"),
        ("/detokenize", {}, "tokens", "Field required"),
    ],
)
def test_bad_requests_are_errors_naming_the_field(server, path, payload, param, fragment):
    status, body = post(server, path, payload)
    assert status in (400, 404), body
    assert body["error"]["param"] == param and fragment in body["error"]["message"], body
