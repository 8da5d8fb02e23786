"""The decoding reference cases (tests/fixtures/decoding_references.json, written by
tools/make_decoding_references.py from transformers) and the engine parameters that replay them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import tiny_checkpoints as tiny

from fastdeploy import LLM, SamplingParams


def load_references() -> dict:
    """{model name: its cases}."""
    return json.loads((tiny.FIXTURES / "decoding_references.json").read_text(encoding="utf-8"))["models"]


def beam_params(case: dict, extra_stops: list[int]) -> SamplingParams:
    """A beam-search reference case as engine parameters; `extra_stops` are the case's end tokens
    the engine does not already stop at."""
    return SamplingParams(
        use_beam_search=True,
        temperature=0,
        n=case["n"],
        best_of=case["num_beams"],
        length_penalty=case["length_penalty"],
        early_stopping=case["early_stopping"],
        max_tokens=case["max_tokens"],
        stop_token_ids=extra_stops,
    )


def generate_checking_each_step(llm: LLM, prompts: list, params: Any, check: Callable[[], None]) -> list:
    """`llm.generate`, calling `check()` after every engine step (the KV bookkeeping invariants of
    beams and drafts hold between steps, not only at the end)."""
    engine = llm.llm_engine
    real_step = engine.step

    def checked_step():
        outputs = real_step()
        check()
        return outputs

    engine.step = checked_step
    try:
        return llm.generate(prompts, params, use_tqdm=False)
    finally:
        del engine.step
