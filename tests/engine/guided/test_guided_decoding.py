"""Guided decoding on the embedded SmolLM2: regexes, choices, grammars, JSON objects, batching
with unconstrained requests, preemption, `n > 1`, and the errors of invalid constraints."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams, StructuredOutputsParams
from fastdeploy.engine.guided.backend import allowed_tokens, bitmask_words
from fastdeploy.errors import InvalidArgumentError

QUESTION = [{"role": "user", "content": "What is the phone number of the office?"}]
PHONE = r"[0-9]{3}-[0-9]{4}"


def chat(llm, params, conversation=QUESTION):
    (output,) = llm.chat(conversation, params, use_tqdm=False)
    assert output.error_code == 200, output.error_msg
    return output


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regex_outputs_fullmatch(llm, temperature):
    params = SamplingParams(
        temperature=temperature, seed=7, n=3, max_tokens=24, guided_decoding=GuidedDecodingParams(regex=PHONE)
    )
    for sample in chat(llm, params).outputs:
        assert re.fullmatch(PHONE, sample.text), sample.text
        assert sample.finish_reason == "stop"  # EOS once the pattern is complete


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_choice_outputs_are_members(llm, temperature):
    choices = ["Paris", "London", "New York City", "東京"]
    params = SamplingParams(
        temperature=temperature,
        seed=3,
        n=4,
        max_tokens=16,
        guided_decoding=GuidedDecodingParams(choice=choices),
    )
    question = [{"role": "user", "content": "Which city is the capital of France?"}]
    assert {sample.text for sample in chat(llm, params, question).outputs} <= set(choices)


def test_lark_and_gbnf_grammars(llm):
    lark = 'start: "The answer is " NUMBER "."\nNUMBER: /[1-9][0-9]?/'
    gbnf = 'root ::= "The answer is " [1-9] [0-9]? "."'
    for grammar in (lark, gbnf):
        params = SamplingParams(
            temperature=0, max_tokens=16, guided_decoding=GuidedDecodingParams(grammar=grammar)
        )
        text = chat(llm, params, [{"role": "user", "content": "What is 6 times 7?"}]).outputs.text
        assert re.fullmatch(r"The answer is [1-9][0-9]?\.", text), text


def test_json_object_and_vllm_names(llm):
    params = SamplingParams(
        temperature=0, max_tokens=120, structured_outputs=StructuredOutputsParams(json_object=True)
    )
    assert params.guided_decoding is params.structured_outputs
    question = [{"role": "user", "content": 'Reply with the JSON object {"cat": "Tom", "age": 3}.'}]
    sample = chat(llm, params, question).outputs
    assert sample.finish_reason == "stop" and isinstance(json.loads(sample.text), dict)


def test_pydantic_model_as_schema(llm):
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")  # additionalProperties: false
        name: str = pydantic.Field(max_length=20)
        population: int = pydantic.Field(ge=0, le=10**8)

    params = SamplingParams(
        temperature=0, max_tokens=60, guided_decoding={"json": City, "disable_any_whitespace": True}
    )
    text = chat(llm, params, [{"role": "user", "content": "Describe Paris as JSON."}]).outputs.text
    City.model_validate_json(text)
    assert json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False) == text  # compact


def test_unconstrained_requests_keep_their_tokens_in_a_mixed_batch(llm):
    plain = [
        [{"role": "user", "content": "Tell me a fact about the moon."}],
        [{"role": "user", "content": "Name three colours."}],
    ]
    greedy = SamplingParams(temperature=0, max_tokens=24)
    seeded = SamplingParams(temperature=0.9, seed=11, max_tokens=24)
    alone = llm.chat(plain, [greedy, seeded], use_tqdm=False)
    constrained = SamplingParams(
        temperature=0, max_tokens=24, guided_decoding=GuidedDecodingParams(regex=PHONE)
    )
    mixed = llm.chat(
        [plain[0], QUESTION, plain[1], QUESTION], [greedy, constrained, seeded, constrained], use_tqdm=False
    )
    assert mixed[0].outputs.token_ids == alone[0].outputs.token_ids
    assert mixed[2].outputs.token_ids == alone[1].outputs.token_ids
    for output in (mixed[1], mixed[3]):
        assert re.fullmatch(PHONE, output.outputs.text)


def test_eos_only_where_the_grammar_can_end(llm):
    engine = llm.llm_engine
    decoder = engine.guided
    compiled = decoder.compile(GuidedDecodingParams(choice=["yes", "yesterday"]))
    matcher = decoder.backend.matcher(compiled)
    bitmask = np.zeros((1, bitmask_words(decoder.vocab_size)), dtype=np.int32)
    eos = sorted(engine.eos_token_ids)

    def allowed() -> np.ndarray:
        decoder.backend.fill_bitmasks([matcher], bitmask)
        return allowed_tokens(bitmask[0], decoder.vocab_size)

    assert not allowed()[eos].any()
    for token in engine.tokenizer.encode("yes", add_special_tokens=False):
        assert matcher.accept_token(token)
    after_yes = allowed()
    assert after_yes[eos].all() and after_yes.sum() > len(eos)  # may end, or go on to "yesterday"
    for token in engine.tokenizer.encode("terday", add_special_tokens=False):
        assert matcher.accept_token(token)
    assert list(np.flatnonzero(allowed())) == eos and matcher.is_terminated()


def test_preemption_and_n_keep_each_matcher_with_its_sample(smollm2_path):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "rank": {"type": "integer", "minimum": 1, "maximum": 99},
        },
        "required": ["city", "rank"],
        "additionalProperties": False,
    }
    # 12 blocks of 16 tokens for 4 x 2 sequences of ~80 tokens: the scheduler must preempt
    small = LLM(
        model=smollm2_path, max_model_len=160, block_size=16, num_gpu_blocks_override=12, max_num_seqs=8
    )
    params = SamplingParams(
        temperature=1.0,
        seed=5,
        n=2,
        max_tokens=48,
        guided_decoding=GuidedDecodingParams(json=schema, disable_any_whitespace=True),
    )
    conversations = [[{"role": "user", "content": f"Give city number {i} as JSON."}] for i in range(4)]
    outputs = small.chat(conversations, params, use_tqdm=False)
    assert small.llm_engine.scheduler.num_preemptions > 0
    for output in outputs:
        for sample in output.outputs:
            if sample.finish_reason == "stop":
                data = json.loads(sample.text)
                assert set(data) == {"city", "rank"} and 1 <= data["rank"] <= 99
    assert not small.llm_engine.guided.active  # every finished sequence's matcher was released


@pytest.mark.parametrize(
    ("guided", "words"),
    [
        ({"json": {"type": "objekt"}}, ["JSON schema", "objekt"]),
        ({"json": {"type": "array", "uniqueItems": True}}, ["uniqueItems"]),
        ({"regex": "(ab"}, ["regex", "unclosed group"]),
        ({"grammar": 'start: "a" | b\n'}, ["unknown name", "1(", "b"]),
        ({"grammar": 'start: "a"\nfoo ::= \n'}, ["grammar", "2("]),
    ],
)
def test_invalid_constraints_fail_alone_with_400(llm, guided, words):
    bad = SamplingParams(temperature=0, max_tokens=4, guided_decoding=guided)
    good = SamplingParams(temperature=0, max_tokens=4)
    outputs = llm.chat([QUESTION, QUESTION], [bad, good], use_tqdm=False)
    assert outputs[0].error_code == 400 and outputs[1].error_code == 200
    assert all(word in outputs[0].error_msg for word in words), outputs[0].error_msg


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"choice": []}, "choice"),
        ({"choice": ["a", 1]}, "choice"),
        ({"regex": ""}, "regex"),
        ({"json": '{"type": '}, "json"),
        ({"json": 3}, "json"),
        ({"regex": "a", "choice": ["a"]}, "regex"),
        ({}, "json"),
        ({"structural_tag": {"structures": [{"begin": "<f>"}], "triggers": ["<g"]}}, "structural_tag"),
    ],
)
def test_shape_errors_name_the_field(kwargs, field):
    with pytest.raises(InvalidArgumentError) as info:
        GuidedDecodingParams(**kwargs)
    assert info.value.field == field


def test_both_names_at_once_are_refused():
    with pytest.raises(InvalidArgumentError, match="structured_outputs"):
        SamplingParams(guided_decoding={"regex": "a"}, structured_outputs={"regex": "b"})


def test_backend_off_refuses_guided_requests(smollm2_path):
    off = LLM(model=smollm2_path, max_model_len=128, guided_decoding_backend="off")
    params = SamplingParams(max_tokens=4, guided_decoding=GuidedDecodingParams(regex="a"))
    (output,) = off.generate("Hi", params, use_tqdm=False)
    assert output.error_code == 400 and "guided_decoding_backend" in output.error_msg
    with pytest.raises(InvalidArgumentError, match="guided_decoding_backend"):
        LLM(model=smollm2_path, max_model_len=128, guided_decoding_backend="outlines")
