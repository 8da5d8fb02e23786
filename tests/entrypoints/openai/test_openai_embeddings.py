"""`POST /v1/embeddings` through the real openai SDK, against sentence-transformers on the same
checkpoint (a tiny random Qwen3 saved by sentence-transformers, last-token pooling, normalised):
strings, token arrays, batches, base64 (the SDK's default) and float, `dimensions`, usage; and
the 400s between the two runners; a checkpoint that embeds texts as chat messages (saved by
sentence-transformers 6 from a tokenizer with a chat template) renders them as sentence-transformers
does."""

from __future__ import annotations

import base64
import sys
import threading
from pathlib import Path

import numpy as np
import openai
import pytest
import uvicorn
from openai_server_helpers import HOST, free_port, http_post, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))

pytest.importorskip(
    "sentence_transformers", reason="the reference embeddings come from sentence-transformers"
)

import embedding_checkpoint  # noqa: E402

from fastdeploy import LLM  # noqa: E402
from fastdeploy.engine.async_engine import AsyncLLMEngine  # noqa: E402
from fastdeploy.entrypoints.openai.app import build_app  # noqa: E402
from fastdeploy.entrypoints.openai.metrics import ServerMetrics  # noqa: E402
from fastdeploy.entrypoints.openai.serving import ServingContext  # noqa: E402

TEXTS = ["the river bank is cold", "paris is the capital of france", "what is the price of a new car"]


def serve(engine, name: str):
    """An in-process server on a loopback port; returns (url, stop)."""
    port = free_port()
    config = uvicorn.Config(
        build_app(ServingContext(AsyncLLMEngine(engine), [name], ServerMetrics())),
        host=HOST,
        port=port,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 120, "the in-process server")

    def stop() -> None:
        server.should_exit = True
        thread.join(60)

    return f"http://{HOST}:{port}", stop


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("emb") / "last")
    return directory, embedding_checkpoint.build(directory, "lasttoken", True)


@pytest.fixture(scope="module")
def pooling_server(checkpoint):
    llm = LLM(checkpoint[0], runner="pooling", pooler_config={"is_matryoshka": True}, max_num_seqs=4)
    url, stop = serve(llm.llm_engine, "tiny-embed")
    yield url
    stop()


@pytest.fixture(scope="module")
def client(pooling_server):
    return openai.OpenAI(base_url=pooling_server + "/v1", api_key="unused", max_retries=0, timeout=120)


def cosine_distance(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return 1 - (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_sdk_default_base64_batch_matches_sentence_transformers(client, checkpoint):
    response = client.embeddings.create(model="tiny-embed", input=TEXTS)  # the SDK asks for base64
    reference = checkpoint[1].encode(TEXTS, convert_to_numpy=True)
    ours = np.array([item.embedding for item in response.data])
    assert [item.index for item in response.data] == [0, 1, 2]
    assert cosine_distance(ours, reference).max() < 1e-5
    tokens = sum(len(checkpoint[1].tokenizer(text)["input_ids"]) for text in TEXTS)
    assert response.usage.prompt_tokens == response.usage.total_tokens == tokens
    assert response.model == "tiny-embed"


def test_float_and_base64_encode_the_same_vector(pooling_server, checkpoint):
    floats = http_post(pooling_server + "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "float"})
    packed = http_post(pooling_server + "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})
    assert floats[0] == packed[0] == 200
    vector = floats[1]["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(packed[1]["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(vector, dtype=np.float32))
    reference = checkpoint[1].encode([TEXTS[0]], convert_to_numpy=True)[0]
    assert cosine_distance(vector, reference) < 1e-5


def test_token_arrays(client, checkpoint):
    ids = [checkpoint[1].tokenizer(text)["input_ids"] for text in TEXTS[:2]]
    one = client.embeddings.create(model="tiny-embed", input=ids[0], encoding_format="float")
    many = client.embeddings.create(model="tiny-embed", input=ids, encoding_format="float")
    reference = checkpoint[1].encode(TEXTS[:2], convert_to_numpy=True)
    assert cosine_distance(one.data[0].embedding, reference[0]) < 1e-5
    assert cosine_distance([item.embedding for item in many.data], reference).max() < 1e-5
    assert many.usage.prompt_tokens == len(ids[0]) + len(ids[1])


def test_dimensions(client, checkpoint):
    response = client.embeddings.create(model="tiny-embed", input=TEXTS, dimensions=16)
    full = checkpoint[1].encode(TEXTS, convert_to_numpy=True)
    cut = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose([item.embedding for item in response.data], cut, atol=1e-5)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="tiny-embed", input="x", dimensions=64)
    assert info.value.body["param"] == "dimensions" and "1 to 32" in info.value.body["message"]


def test_bad_inputs_are_400_naming_input(pooling_server):
    for payload, words in (
        ({"input": []}, "must not be an empty list"),
        ({"input": [[1, 99999]]}, "prompt token ids must be in"),
        ({"input": [{"prompt": "x"}]}, "input"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ):
        status, body = http_post(pooling_server + "/v1/embeddings", payload)
        assert status == 400, payload
        assert words in body["error"]["message"] or words == body["error"]["param"], body


def test_generation_on_a_pooling_server_is_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "wrong_runner"
    assert (
        "--runner generate" in info.value.body["message"] and "/v1/embeddings" in info.value.body["message"]
    )
    with pytest.raises(openai.BadRequestError, match="--runner generate"):
        client.completions.create(model="tiny-embed", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="--runner generate"):
        client.responses.create(model="tiny-embed", input="hi")


def test_tokenize_serves_either_runner(pooling_server, checkpoint):
    status, body = http_post(pooling_server + "/tokenize", {"prompt": TEXTS[0]})
    assert status == 200
    # /tokenize encodes as generation does (no appended end token); embeddings add it
    assert body["tokens"] == checkpoint[1].tokenizer(TEXTS[0])["input_ids"][:-1]


def test_embeddings_on_a_generating_server_is_400(llm):
    url, stop = serve(llm.llm_engine, "smollm2")
    try:
        generating = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as info:
            generating.embeddings.create(model="smollm2", input="hello")
        assert info.value.body["code"] == "wrong_runner"
        assert "--runner pooling" in info.value.body["message"]
    finally:
        stop()


def test_chat_template_checkpoint_renders_inputs_as_sentence_transformers(tmp_path):
    directory = str(tmp_path / "chat")
    reference = embedding_checkpoint.build(
        directory,
        "lasttoken",
        True,
        prompts={"query": embedding_checkpoint.QUERY_PROMPT},
        chat_template=embedding_checkpoint.CHATML,
    )
    llm = LLM(directory, runner="pooling", max_num_seqs=4, max_model_len=128)
    url, stop = serve(llm.llm_engine, "chat-embed")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        response = client.embeddings.create(model="chat-embed", input=TEXTS)
        ours = np.array([item.embedding for item in response.data])
        assert cosine_distance(ours, reference.encode(TEXTS, convert_to_numpy=True)).max() < 1e-5
        mask = reference.preprocess(TEXTS)["attention_mask"]
        assert response.usage.prompt_tokens == int(mask.sum())  # the rendered chats' tokens
        queried = client.embeddings.create(
            model="chat-embed", input=TEXTS, extra_body={"prompt_name": "query"}, encoding_format="float"
        )
        expected = reference.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
        ours = np.array([item.embedding for item in queried.data])
        assert cosine_distance(ours, expected).max() < 1e-5
    finally:
        stop()
