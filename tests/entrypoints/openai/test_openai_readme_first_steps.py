"""README's "first five minutes": its curl command and its openai-client snippet, run as written
against a real server (only http://localhost:8080 is replaced by the test server's address)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from fastdeploy import SamplingParams

README = os.path.join(os.path.dirname(__file__), "..", "..", "..", "README.md")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def first_steps(language: str) -> str:
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("\n## The first five minutes\n", 1)[1].split("\n## ", 1)[0]
    blocks = [
        re.sub(r"^   ", "", b, flags=re.MULTILINE)
        for b in re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)
    ]
    return blocks


def expected_answer(llm) -> str:
    (output,) = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    return output.outputs.text


def test_the_curl_command_answers_greedily(server, llm):
    (curl,) = [b for b in first_steps("bash") if b.startswith("curl")]
    command = curl.replace("http://localhost:8080", server.url)
    assert command != curl
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["choices"][0]["message"]["content"] == expected_answer(llm)


def test_the_openai_client_snippet_prints_the_answer(server, llm):
    (snippet,) = first_steps("python")
    code = snippet.replace("http://localhost:8080", server.url)
    assert code != snippet
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    answer = expected_answer(llm)
    assert done.stdout == answer + "\n"
    assert snippet.rstrip().endswith(f"# {answer}")  # the comment shows what it really prints


def test_the_commands_name_the_served_model():
    serve = next(b for b in first_steps("bash") if "fastdeploy serve" in b)
    assert "serve SmolLM2-135M-Instruct --port 8080" in serve
