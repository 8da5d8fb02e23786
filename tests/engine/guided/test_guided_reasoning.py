"""With a reasoning parser, the grammar applies only after the reasoning ends; the thinking is
never constrained. A tiny random-weight Qwen3 with a SentencePiece tokenizer (so this also
covers the byte table built for tokenizers outside the `tokenizers` library)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
import tiny_checkpoints as tiny  # noqa: E402

TEMPLATE = tiny.QWEN3_THINKING_TEMPLATE
CHAT = [{"role": "user", "content": "Code?"}]
CODE = r"[0-9]{3}-[A-Z]{2}"
THINK_TOKENS = 6


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> LLM:
    directory = tmp_path_factory.mktemp("qwen3-guided")
    tiny.write_checkpoint(directory, "qwen3", "pt", config_overrides={"vocab_size": tiny.CHAT_VOCAB_SIZE})
    tiny.write_ernie_tokenizer(directory, chat_template=TEMPLATE)
    return LLM(model=str(directory), max_model_len=128, reasoning_parser="qwen3")


def run(llm, guided, **kwargs):
    params = SamplingParams(
        temperature=0, max_tokens=24, reasoning_max_tokens=THINK_TOKENS, guided_decoding=guided
    )
    (output,) = llm.chat(CHAT, params, use_tqdm=False, **kwargs)
    assert output.error_code == 200, output.error_msg
    return output.outputs


def test_thinking_is_unconstrained_and_the_answer_follows_the_grammar(qwen3):
    plain = run(qwen3, None)
    guided = run(qwen3, GuidedDecodingParams(regex=CODE))
    end = tiny.added_token_id("</think>")
    thought = guided.token_ids[: guided.token_ids.index(end)]
    assert thought == plain.token_ids[: len(thought)] and len(thought) == THINK_TOKENS
    assert re.fullmatch(CODE, guided.text), guided.text
    assert guided.reasoning_content == plain.reasoning_content


def test_with_thinking_off_the_grammar_applies_from_the_first_token(qwen3):
    sample = run(
        qwen3, GuidedDecodingParams(choice=["yes", "no"]), chat_template_kwargs={"enable_thinking": False}
    )
    assert sample.text in ("yes", "no") and sample.finish_reason == "stop"
