"""Every output for 28 real-shaped JSON schemas parses and validates with `jsonschema`, greedy
and sampled, all in one continuously batched call on the embedded SmolLM2."""

from __future__ import annotations

import json

import jsonschema
from schemas import SCHEMAS

from fastdeploy import GuidedDecodingParams, SamplingParams


def test_every_output_validates(llm):
    conversations, params, cases = [], [], []
    for index, (name, schema) in enumerate(SCHEMAS.items()):
        question = [{"role": "user", "content": f"Reply with JSON for a {name.replace('_', ' ')}."}]
        guided = GuidedDecodingParams(json=schema)
        for temperature in (0.0, 0.8):
            conversations.append(question)
            params.append(
                SamplingParams(temperature=temperature, seed=index, max_tokens=160, guided_decoding=guided)
            )
            cases.append(f"{name} at temperature {temperature}")
    outputs = llm.chat(conversations, params, use_tqdm=False)
    for case, output, schema in zip(
        cases, outputs, [s for s in SCHEMAS.values() for _ in (0, 1)], strict=True
    ):
        sample = output.outputs
        assert sample.finish_reason == "stop", f"{case}: {sample.finish_reason} after {sample.text!r}"
        jsonschema.validate(json.loads(sample.text), schema)
