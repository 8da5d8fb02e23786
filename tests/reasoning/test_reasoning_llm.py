"""Chat template, thinking switch and reasoning parser together, through `LLM.chat`.

Tiny random-weight ERNIE-4.5 and Qwen3 models whose vocabulary covers the ERNIE tokenizer (so
every generated id decodes). Their words are random, so the checks are structural: what the
prompt ends with, that the forced `</think>` lands where `reasoning_max_tokens` says, and that
the parser's parts are exactly the decoded text around it.
"""

from __future__ import annotations

import json

import pytest
import tiny_checkpoints as tiny

from fastdeploy import LLM, SamplingParams
from fastdeploy.input.ernie_templates import ERNIE_THINKING_CHAT_TEMPLATE
from fastdeploy.plugins.hookspecs import hookimpl
from fastdeploy.plugins.registry import get_registry
from fastdeploy.reasoning.ernie_x1 import ErnieX1ReasoningParser

QWEN3_TEMPLATE = tiny.QWEN3_THINKING_TEMPLATE
MESSAGES = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "1+1 等于几？"}]
END_THINK = tiny.added_token_id("</think>")


def _model_dir(tmp_path_factory, name: str, template: str) -> str:
    directory = tmp_path_factory.mktemp(f"{name}-chat")
    tiny.write_checkpoint(directory, name, "pt", config_overrides={"vocab_size": tiny.CHAT_VOCAB_SIZE})
    tiny.write_ernie_tokenizer(directory, chat_template=template)
    return str(directory)


@pytest.fixture(scope="module")
def ernie(tmp_path_factory) -> LLM:
    return LLM(
        model=_model_dir(tmp_path_factory, "ernie4_5", ERNIE_THINKING_CHAT_TEMPLATE),
        max_model_len=128,
        reasoning_parser="ernie-45-vl",
    )


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> LLM:
    return LLM(
        model=_model_dir(tmp_path_factory, "qwen3", QWEN3_TEMPLATE),
        max_model_len=128,
        reasoning_parser="qwen3",
    )


def _greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def test_thinking_off_gives_an_empty_think_block_and_no_reasoning(ernie):
    (output,) = ernie.chat(
        MESSAGES, _greedy(6), chat_template_kwargs={"enable_thinking": False}, use_tqdm=False
    )
    assert (
        output.prompt
        == "<|begin_of_sentence|>You are helpful.\nUser: 1+1 等于几？\nAssistant: <think>\n\n</think>\n\n"
    )
    assert output.outputs.reasoning_content is None
    assert output.outputs.text == ernie.get_tokenizer().decode(output.outputs.token_ids)
    assert len(output.outputs.token_ids) == 6


def test_reasoning_budget_forces_the_end_of_thinking(ernie):
    (output,) = ernie.chat(MESSAGES, _greedy(8, reasoning_max_tokens=3), use_tqdm=False)
    assert output.prompt.endswith("Assistant: <think>\n")
    ids = output.outputs.token_ids
    assert END_THINK not in ids[:3] and ids[3] == END_THINK
    decode = ernie.get_tokenizer().decode
    assert output.outputs.reasoning_content == decode(ids[:3]).strip("\n")
    assert output.outputs.text == decode(ids[4:]).lstrip("\n")


def test_thinking_on_without_an_end_tag_is_all_reasoning(ernie):
    (output,) = ernie.chat(MESSAGES, _greedy(5), use_tqdm=False)
    assert END_THINK not in output.outputs.token_ids
    assert output.outputs.reasoning_content == ernie.get_tokenizer().decode(output.outputs.token_ids).strip(
        "\n"
    )
    assert output.outputs.text == ""


@pytest.mark.parametrize(
    ("kwargs", "ending"),
    [
        ({"enable_thinking": False}, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        ({}, "<|im_start|>assistant\n"),
    ],
)
def test_qwen3_template_and_parser(qwen3, kwargs, ending):
    (output,) = qwen3.chat(
        MESSAGES, _greedy(5, reasoning_max_tokens=2), chat_template_kwargs=kwargs, use_tqdm=False
    )
    assert output.prompt.endswith(ending)
    ids = output.outputs.token_ids
    decode = qwen3.get_tokenizer().decode
    if kwargs.get("enable_thinking") is False:
        # thinking off: no forced </think>, and everything is the answer
        assert END_THINK not in ids and output.outputs.reasoning_content is None
        assert output.outputs.text == decode(ids)
    else:
        assert ids[2] == END_THINK
        assert output.outputs.reasoning_content == decode(ids[:2]).strip("\n")
        assert output.outputs.text == decode(ids[3:]).lstrip("\n")


class _AnswerIsAToolCall:
    """A plugin whose parser (ERNIE-X1's rules) sees every finished output as a tool call, so
    the test can check the engine hands the parser's tool calls to `CompletionOutput`."""

    class Parser(ErnieX1ReasoningParser):
        def split(self, text, *, thinking_enabled, finished):
            arguments = json.dumps({"n": len(text)})
            call = f'<tool_call>{{"name": "lookup", "arguments": {arguments}}}</tool_call>'
            return super().split("</think>" + call, thinking_enabled=True, finished=finished)

    @hookimpl
    def fastdeploy_reasoning_parsers(self):
        return {"test-tool-calls": self.Parser}


@pytest.fixture
def tool_call_plugin():
    registry = get_registry()
    registry.register(_AnswerIsAToolCall(), name="test-tool-calls")
    yield
    registry.manager.unregister(name="test-tool-calls")


def test_engine_fills_tool_calls_from_the_parser(tmp_path_factory, tool_call_plugin):
    directory = _model_dir(tmp_path_factory, "ernie4_5", ERNIE_THINKING_CHAT_TEMPLATE)
    llm = LLM(model=directory, max_model_len=128, reasoning_parser="test-tool-calls")
    (output,) = llm.chat(MESSAGES, _greedy(4), use_tqdm=False)
    calls = output.outputs.tool_calls
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("lookup", {"n": len(llm.get_tokenizer().decode(output.outputs.token_ids))})
    ]
    assert output.outputs.text == ""


def test_ernie_checkpoint_without_a_template_uses_the_registered_one(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ernie-no-template")
    tiny.write_checkpoint(directory, "ernie4_5", "pt", config_overrides={"vocab_size": tiny.CHAT_VOCAB_SIZE})
    tiny.write_ernie_tokenizer(directory, chat_template=None)
    llm = LLM(model=str(directory), max_model_len=256)
    (output,) = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    # DESIGN.md's ERNIE-4.5 format: BOS, system content, "User: ...", then the generation prompt
    assert output.prompt == "<|begin_of_sentence|>You are helpful.\nUser: 1+1 等于几？\nAssistant: "
