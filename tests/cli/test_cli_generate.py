"""`fastdeploy generate`: one output entry per prompt, in order; a failed prompt keeps its place,
goes to stderr, and makes the exit status non-zero."""

from __future__ import annotations

import json

import pytest

from fastdeploy import SamplingParams
from fastdeploy.cli import main

PROMPTS = ["The capital of France is", "", "Once upon a time"]
ENGINE = ["--max-model-len", "1024", "--max-num-seqs", "32", "--max-tokens", "6"]


@pytest.fixture
def expected(llm, monkeypatch) -> list[str]:
    """The shared engine's answers; the command is given that same engine (no second model load)."""
    built = []

    def shared_llm(**kwargs):
        built.append(kwargs)
        return llm

    monkeypatch.setattr("fastdeploy.LLM", shared_llm)
    outputs = llm.generate(
        [PROMPTS[0], PROMPTS[2]], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False
    )
    yield [output.outputs.text for output in outputs]
    assert [(kwargs["max_model_len"], kwargs["max_num_seqs"]) for kwargs in built] == [(1024, 32)]


def prompt_flags(prompts: list[str]) -> list[str]:
    return [flag for prompt in prompts for flag in ("--prompt", prompt)]


def test_failed_prompt_keeps_its_line_and_fails_the_exit_status(capsys, expected):
    assert main(["generate", *ENGINE, *prompt_flags(PROMPTS)]) == 1
    captured = capsys.readouterr()
    escaped = [text.replace("\\", "\\\\").replace("\n", "\\n") for text in expected]
    assert captured.out.split("\n") == [escaped[0], "", escaped[1], ""]
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and errors[0].startswith("error: prompt 2: ")
    assert "empty" in errors[0]


def test_jsonl_output_names_the_error_in_place(capsys, expected):
    assert main(["generate", *ENGINE, "--output-format", "jsonl", *prompt_flags(PROMPTS)]) == 1
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [record["prompt"] for record in records] == PROMPTS
    assert [records[0]["text"], records[2]["text"]] == expected
    assert records[1]["text"] is None and "empty" in records[1]["error"]
    assert records[0]["error"] is None and records[0]["finish_reason"] == "length"


def test_all_prompts_succeeding_exits_0(capsys, expected):
    assert main(["generate", *ENGINE, *prompt_flags([PROMPTS[0]])]) == 0
    assert capsys.readouterr().out == expected[0].replace("\n", "\\n") + "\n"
