"""The Responses API on an in-process server whose engine has a reasoning parser (`qwen3`) and a
store of two responses: reasoning items and their token count, streamed and not, and the store
forgetting the least recently used response."""

from __future__ import annotations

import threading

import openai
import pytest
import uvicorn
from openai_server_helpers import HOST, free_port, wait_until

from fastdeploy import LLM
from fastdeploy.engine.async_engine import AsyncLLMEngine
from fastdeploy.entrypoints.openai.app import build_app
from fastdeploy.entrypoints.openai.metrics import ServerMetrics
from fastdeploy.entrypoints.openai.serving import ServingContext

MODEL = "reasoner"
QUESTION = "What is the capital of France?"
#: SmolLM2 never closes a `<think>` block itself; past this many tokens the engine writes `</think>`
THINKING_BUDGET = 5


@pytest.fixture(scope="module")
def client():
    llm = LLM(max_model_len=1024, max_num_seqs=8, reasoning_parser="qwen3")
    engine = AsyncLLMEngine(llm.llm_engine)
    ctx = ServingContext(engine, [MODEL], ServerMetrics(), responses_store_size=2)
    server = uvicorn.Server(uvicorn.Config(build_app(ctx), host=HOST, port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 120, "the in-process server")
    yield openai.OpenAI(
        base_url=f"http://{HOST}:{server.config.port}/v1", api_key="unused", max_retries=0, timeout=120
    )
    server.should_exit = True
    thread.join(60)


def budgeted(client, **kwargs):
    return client.responses.create(
        model=MODEL,
        input=QUESTION,
        temperature=0,
        max_output_tokens=24,
        extra_body={"reasoning_max_tokens": THINKING_BUDGET},
        **kwargs,
    )


def test_reasoning_item_before_the_message_with_its_token_count(client):
    response = budgeted(client)
    expected = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=24,
        extra_body={"reasoning_max_tokens": THINKING_BUDGET},
    )
    message = expected.choices[0].message
    assert message.reasoning_content and message.content  # the engine closed the thinking block
    reasoning, answer = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == message.reasoning_content
    assert answer.type == "message" and response.output_text == message.content
    assert response.usage.output_tokens_details.reasoning_tokens == THINKING_BUDGET
    assert response.usage.output_tokens == expected.usage.completion_tokens


def test_streamed_reasoning_comes_first_as_its_own_item(client):
    expected = budgeted(client)
    with client.responses.stream(
        model=MODEL,
        input=QUESTION,
        temperature=0,
        max_output_tokens=24,
        extra_body={"reasoning_max_tokens": THINKING_BUDGET},
    ) as stream:
        events = list(stream)
    reasoning = [event for event in events if event.type == "response.reasoning_text.delta"]
    text = [event for event in events if event.type == "response.output_text.delta"]
    assert {event.output_index for event in reasoning} == {0} and {event.output_index for event in text} == {
        1
    }
    assert events.index(reasoning[-1]) < events.index(text[0])
    assert "".join(event.delta for event in reasoning) == expected.output[0].content[0].text
    assert "".join(event.delta for event in text) == expected.output_text
    final = events[-1].response
    assert final.usage.output_tokens_details.reasoning_tokens == THINKING_BUDGET


def test_a_block_never_closed_is_all_reasoning(client):
    response = client.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=8)
    assert [item.type for item in response.output] == ["reasoning"]
    assert response.usage.output_tokens_details.reasoning_tokens == response.usage.output_tokens == 8


def test_the_store_forgets_the_least_recently_used_response(client):
    def create():
        return client.responses.create(model=MODEL, input="Hi", temperature=0, max_output_tokens=2)

    first, second = create(), create()
    client.responses.retrieve(first.id)  # now more recent than the second
    third = create()
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="Hi", previous_response_id=second.id, max_output_tokens=2)
    assert client.responses.retrieve(first.id).id == first.id
    assert client.responses.retrieve(third.id).id == third.id
