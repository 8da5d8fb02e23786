"""An in-process server (uvicorn in a thread, real HTTP on a loopback port) whose engine has a
reasoning parser, and `AsyncLLMEngine` driven directly from several event loops."""

from __future__ import annotations

import asyncio
import sys
import threading
from contextlib import aclosing

import openai
import pytest
import uvicorn
from openai_server_helpers import HOST, free_port, wait_until

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.async_engine import AsyncLLMEngine
from fastdeploy.entrypoints.openai.app import build_app
from fastdeploy.entrypoints.openai.metrics import ServerMetrics
from fastdeploy.entrypoints.openai.serving import ServingContext
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.reasoning.base import ReasoningParser, ReasoningSplit
from fastdeploy.text_utils import partial_suffix_length

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


class SplitAtParis(ReasoningParser):
    """Test parser: whatever precedes the word "Paris" is reasoning."""

    def split(self, text, *, thinking_enabled, finished):
        if not thinking_enabled:
            return ReasoningSplit(None, text)
        index = text.find("Paris")
        if index < 0:
            held = 0 if finished else partial_suffix_length(text, ["Paris"])
            return ReasoningSplit(text[: len(text) - held], "")
        return ReasoningSplit(text[:index], text[index:])

    def reasoning_end_token_ids(self):
        return self.tokenizer.encode(" Paris", add_special_tokens=False)


@pytest.fixture(scope="module")
def app_server():
    llm = LLM(max_model_len=1024, max_num_seqs=8)
    llm.llm_engine.reasoning_parser = SplitAtParis(llm.get_tokenizer())
    engine = AsyncLLMEngine(llm.llm_engine)
    metrics = ServerMetrics()
    engine.add_observer(metrics.observe_step)
    port = free_port()
    config = uvicorn.Config(
        build_app(ServingContext(engine, ["reasoner"], metrics)), host=HOST, port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 120, "the in-process server")
    yield engine, f"http://{HOST}:{port}"
    server.should_exit = True
    thread.join(60)
    assert not engine.is_running


@pytest.fixture
def reference(llm):
    """The shared offline LLM with the same reasoning parser, for the expected answers."""
    llm.llm_engine.reasoning_parser = SplitAtParis(llm.get_tokenizer())
    yield llm
    llm.llm_engine.reasoning_parser = None


@pytest.fixture
def client(app_server):
    return openai.OpenAI(base_url=app_server[1] + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_carries_reasoning_content(client, reference):
    (expected,) = reference.chat(CHAT, SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)
    assert expected.outputs.reasoning_content and expected.outputs.text  # the parser split something
    # the zh offline-inference seed's ERNIE-X1 example reads it as `output.outputs.resoning_content`
    assert expected.outputs.resoning_content == expected.outputs.reasoning_content
    response = client.chat.completions.create(model="reasoner", messages=CHAT, max_tokens=10, temperature=0)
    message = response.choices[0].message
    assert message.reasoning_content == expected.outputs.reasoning_content
    assert message.content == expected.outputs.text


def test_stream_deltas_carry_reasoning_content(client, reference):
    (expected,) = reference.chat(CHAT, SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)
    stream = client.chat.completions.create(
        model="reasoner", messages=CHAT, max_tokens=10, temperature=0, stream=True
    )
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    assert (
        "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        == expected.outputs.reasoning_content
    )
    assert "".join(d.content or "" for d in deltas) == expected.outputs.text


def test_completions_carry_reasoning_content_streamed_and_not(client, reference):
    """The parser takes the reasoning out of `text`; a completion choice carries it beside."""
    params = SamplingParams(temperature=0, max_tokens=10)
    (chat,) = reference.chat(CHAT, params, use_tqdm=False)
    prompt = list(chat.prompt_token_ids)
    (expected,) = reference.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    assert expected.outputs.reasoning_content and expected.outputs.text  # the parser split something
    response = client.completions.create(model="reasoner", prompt=prompt, max_tokens=10, temperature=0)
    choice = response.choices[0]
    assert choice.text == expected.outputs.text
    assert choice.model_extra["reasoning_content"] == expected.outputs.reasoning_content
    stream = client.completions.create(
        model="reasoner", prompt=prompt, max_tokens=10, temperature=0, stream=True
    )
    chunks = [chunk.choices[0] for chunk in stream if chunk.choices]
    assert "".join(c.text for c in chunks) == expected.outputs.text
    assert (
        "".join(c.model_extra.get("reasoning_content") or "" for c in chunks)
        == expected.outputs.reasoning_content
    )


def test_enable_thinking_false_and_reasoning_max_tokens(client, reference):
    (off,) = reference.chat(
        CHAT,
        SamplingParams(temperature=0, max_tokens=10),
        use_tqdm=False,
        chat_template_kwargs={"enable_thinking": False},
    )
    response = client.chat.completions.create(
        model="reasoner",
        messages=CHAT,
        max_tokens=10,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert response.choices[0].message.content == off.outputs.text
    assert getattr(response.choices[0].message, "reasoning_content", None) is None
    (forced,) = reference.chat(
        CHAT, SamplingParams(temperature=0, max_tokens=12, reasoning_max_tokens=2), use_tqdm=False
    )
    response = client.chat.completions.create(
        model="reasoner", messages=CHAT, max_tokens=12, temperature=0, extra_body={"reasoning_max_tokens": 2}
    )
    assert response.choices[0].message.content == forced.outputs.text
    assert response.choices[0].message.reasoning_content == forced.outputs.reasoning_content


def test_idle_engine_thread_sleeps_on_its_condition(app_server):
    engine, _ = app_server

    def waiting_on_condition() -> bool:
        frame = sys._current_frames().get(engine._thread.ident)
        return (
            frame is not None
            and frame.f_code.co_name == "wait"
            and frame.f_code.co_filename.endswith("threading.py")
        )

    wait_until(waiting_on_condition, 30, "the engine thread to block in Condition.wait")


def test_generate_from_several_event_loops(app_server, llm):
    engine, _ = app_server
    tokenizer = llm.get_tokenizer()
    prompts = ["The capital of France is", "Once upon a time", "def add(a, b):"]
    params = SamplingParams(temperature=0, max_tokens=6)
    expected = [o.outputs.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    results: dict[int, list[int]] = {}

    async def consume(index: int) -> None:
        async with aclosing(
            engine.generate(f"loop-{index}", tokenizer.encode(prompts[index]), params)
        ) as outputs:
            async for output in outputs:
                results[index] = output.outputs.token_ids

    threads = [threading.Thread(target=asyncio.run, args=(consume(i),)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [results[i] for i in range(3)] == expected


def test_leaving_a_stream_early_aborts_and_frees_blocks(app_server, llm):
    engine, _ = app_server
    blocks = engine.engine.block_manager
    tokenizer = llm.get_tokenizer()

    async def read_two() -> int:
        params = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
        seen = 0
        async with aclosing(
            engine.generate("early-exit", tokenizer.encode("Count: 1, 2,"), params)
        ) as outputs:
            async for _ in outputs:
                seen += 1
                if seen == 2:
                    assert blocks.num_free_blocks < blocks.num_blocks
                    break
        return seen

    assert asyncio.run(read_two()) == 2
    wait_until(lambda: blocks.num_free_blocks == blocks.num_blocks, 30, "the blocks to be freed")
    wait_until(lambda: not engine.engine.requests, 30, "the request to be dropped")


def test_engine_side_rejection_reaches_the_caller(app_server):
    engine, _ = app_server

    async def bad() -> None:
        async for _ in engine.generate("bad-ids", [10**9], SamplingParams(max_tokens=2)):
            pass

    with pytest.raises(InvalidArgumentError, match="token ids must be in"):
        asyncio.run(bad())
