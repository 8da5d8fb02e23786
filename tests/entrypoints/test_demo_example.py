"""`make demo`'s script (examples/offline_inference.py) prints greedy answers first, equal to what
`LLM.chat` / `LLM.generate` give for the same requests, then two sampled continuations."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from fastdeploy import SamplingParams

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "examples", "offline_inference.py")


def test_demo_shows_greedy_chat_and_completions_then_samples(llm, tmp_path):
    done = subprocess.run(
        [sys.executable, DEMO], capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    greedy = SamplingParams(temperature=0, max_tokens=64)
    questions = ["What is the capital of France?", "What is the boiling point of water in Celsius?"]
    answers = llm.chat([[{"role": "user", "content": q}] for q in questions], greedy, use_tqdm=False)
    completion = SamplingParams(temperature=0, max_tokens=16, stop=["\n"])
    prompts = ["The capital of France is", "The first man on the moon was"]
    completions = llm.generate(prompts, completion, use_tqdm=False)
    expected = "".join(
        f"User: {q}\nAssistant: {a.outputs.text}\n\n" for q, a in zip(questions, answers, strict=True)
    )
    expected += "".join(
        f"Prompt: {p!r}\nCompletion: {c.outputs.text!r}\n\n"
        for p, c in zip(prompts, completions, strict=True)
    )
    assert done.stdout.startswith(expected)
    assert "Paris" in answers[0].outputs.text  # the first thing a newcomer reads is right
    tail = done.stdout[len(expected) :]
    assert re.findall(r"^Sample (\d): Once upon a time, in a small village,", tail, re.MULTILINE) == [
        "1",
        "2",
    ]
