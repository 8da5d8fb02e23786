"""Checkpoints that embed texts as chat messages (sentence-transformers 6 saved from a tokenizer
with a chat template: a "message" modality in sentence_bert_config.json): `LLM.embed` and
`/v1/embeddings` (tests/entrypoints/openai/test_openai_embeddings.py) feed the model what sentence-transformers' `preprocess` feeds it (the same token
ids) and give its embeddings, plain, with a prompt (a system message), in batches of mixed
lengths, with a flat and a structured template; a checkpoint whose config has no modality_config
(older sentence-transformers) stays text-only, as sentence-transformers loads it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

pytest.importorskip(
    "sentence_transformers", reason="the reference embeddings come from sentence-transformers"
)
torch = pytest.importorskip("torch", reason="sentence-transformers runs on torch")

import embedding_checkpoint  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

from fastdeploy import LLM  # noqa: E402
from fastdeploy.errors import UnsupportedModelError  # noqa: E402
from fastdeploy.input.embedding_text import TextRendering, read_text_rendering  # noqa: E402

SENTENCES = [
    "the river bank is cold in the morning",
    "what",
    "a small red bird on a green tree in the warm rain at night " * 2,
    "paris is the capital of france",
]
PROMPTS = {"query": embedding_checkpoint.QUERY_PROMPT, "document": ""}
#: the issue's bound
COSINE = 1e-5
#: config.json's keys the settings are read with
QWEN3 = {"model_type": "qwen3"}


def cosine_distance(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return 1 - (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def reference_ids(model, texts: list[str], prompt: str | None = None) -> list[list[int]]:
    """What sentence-transformers feeds the model for each text (padding removed)."""
    features = model.preprocess(texts, prompt=prompt)
    return [
        [int(i) for i, keep in zip(ids, mask, strict=True) if keep]
        for ids, mask in zip(features["input_ids"].tolist(), features["attention_mask"].tolist(), strict=True)
    ]


def embedded(outputs) -> tuple[np.ndarray, list[list[int]]]:
    assert all(output.error_code == 200 for output in outputs), [output.error for output in outputs]
    return np.array([o.outputs.embedding for o in outputs]), [list(o.prompt_token_ids) for o in outputs]


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """Last-token pooling, normalised, a ChatML template over string content, with prompts."""
    directory = str(tmp_path_factory.mktemp("emb") / "flat")
    reference = embedding_checkpoint.build(
        directory, "lasttoken", True, prompts=PROMPTS, chat_template=embedding_checkpoint.CHATML
    )
    return directory, reference


@pytest.fixture(scope="module")
def structured(tmp_path_factory):
    """Mean pooling over a template that takes typed content parts, with the generation prompt on."""
    directory = str(tmp_path_factory.mktemp("emb") / "structured")
    reference = embedding_checkpoint.build(
        directory,
        "mean",
        False,
        seed=31,
        prompts=PROMPTS,
        chat_template=embedding_checkpoint.CHATML_PARTS,
        processing_kwargs={"chat_template": {"add_generation_prompt": True}},
    )
    return directory, reference


@pytest.fixture(scope="module")
def flat_llm(flat):
    # a small budget: the rendered chats are computed in chunks, the batch in several steps
    return LLM(flat[0], runner="pooling", max_num_batched_tokens=16, max_num_seqs=3, max_model_len=128)


def test_the_checkpoints_are_saved_with_a_message_modality(flat, structured):
    formats = []
    for directory, _ in (flat, structured):
        config = json.loads((Path(directory) / "sentence_bert_config.json").read_text())
        formats.append(config["modality_config"]["message"]["format"])
    assert formats == ["flat", "structured"]


def test_flat_chat_tokens_and_embeddings_equal_sentence_transformers(flat, flat_llm):
    directory, reference = flat
    ours, ids = embedded(flat_llm.embed(SENTENCES, use_tqdm=False))
    expected_ids = reference_ids(reference, SENTENCES)
    assert ids == expected_ids
    pieces = embedding_checkpoint.vocabulary(chat=True)
    im_start, im_end = pieces.index("<|im_start|>"), pieces.index("<|im_end|>")
    assert ids[1][0] == im_start and ids[1][-1] == im_end  # a chat, not the text with <|endoftext|>
    expected = reference.encode(SENTENCES, convert_to_numpy=True)
    assert cosine_distance(ours, expected).max() < COSINE


def test_a_prompt_becomes_the_system_message(flat, flat_llm):
    directory, reference = flat
    ours, ids = embedded(flat_llm.embed(SENTENCES, prompt_name="query", use_tqdm=False))
    assert ids == reference_ids(reference, SENTENCES, embedding_checkpoint.QUERY_PROMPT)
    expected = reference.encode(SENTENCES, prompt_name="query", convert_to_numpy=True)
    assert cosine_distance(ours, expected).max() < COSINE
    # the empty "document" prompt adds no system message, as in sentence-transformers
    _, plain_ids = embedded(flat_llm.embed(SENTENCES[:1], prompt_name="document", use_tqdm=False))
    assert plain_ids == reference_ids(reference, SENTENCES[:1], "")


def test_structured_content_and_generation_prompt_equal_sentence_transformers(structured):
    directory, reference = structured
    llm = LLM(directory, runner="pooling", max_num_batched_tokens=16, max_num_seqs=3, max_model_len=128)
    for prompt_name in (None, "query"):
        ours, ids = embedded(llm.embed(SENTENCES, prompt_name=prompt_name, use_tqdm=False))
        prompt = PROMPTS[prompt_name] if prompt_name else None
        assert ids == reference_ids(reference, SENTENCES, prompt)
        expected = reference.encode(SENTENCES, prompt_name=prompt_name, convert_to_numpy=True)
        assert cosine_distance(ours, expected).max() < COSINE


def test_token_id_inputs_are_embedded_as_given(flat_llm):
    ids = [5, 9, 11, 2]
    (output,) = flat_llm.embed([ids], use_tqdm=False)
    assert output.error_code == 200 and list(output.prompt_token_ids) == ids


def edited_copy(source: str, destination: Path, **changes) -> SentenceTransformer:
    """A copy of a checkpoint with its sentence_bert_config.json changed (a None value removes
    the key), loaded by sentence-transformers from the files."""
    shutil.copytree(source, destination)
    config_path = destination / "sentence_bert_config.json"
    config = json.loads(config_path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    config_path.write_text(json.dumps(config))
    return SentenceTransformer(str(destination), device="cpu")


def assert_as_sentence_transformers(llm, reference) -> list[list[int]]:
    """Our token ids and embeddings equal sentence-transformers', with and without the query
    prompt; returns the ids fed without a prompt."""
    fed = []
    for prompt_name in (None, "query"):
        ours, ids = embedded(llm.embed(SENTENCES, prompt_name=prompt_name, use_tqdm=False))
        assert ids == reference_ids(reference, SENTENCES, PROMPTS[prompt_name] if prompt_name else None)
        expected = reference.encode(SENTENCES, prompt_name=prompt_name, convert_to_numpy=True)
        assert cosine_distance(ours, expected).max() < COSINE
        fed.append(ids)
    return fed[0]


def test_a_config_without_modality_config_stays_text_only(tmp_path, flat):
    """What older sentence-transformers saved: loading it, sentence-transformers embeds the text
    itself (with the tokenizer's <|endoftext|>), and so do we."""
    legacy = tmp_path / "legacy"
    reference = edited_copy(flat[0], legacy, modality_config=None, module_output_name=None)
    ids = assert_as_sentence_transformers(LLM(str(legacy), runner="pooling", max_model_len=128), reference)
    assert all(row[-1] == 2 for row in ids)  # the tokenizer's <|endoftext|>, no chat


@pytest.mark.parametrize(
    "changes",
    [
        {"max_seq_length": 9},  # a chat cut, the template's tail (with the generation prompt) put back
        {"max_seq_length": 9, "processing_kwargs": {"chat_template": {"restore_suffix": False}}},
        {"max_seq_length": 7, "modality_config": None, "module_output_name": None},  # text: ends kept
    ],
    ids=["chat", "chat-no-restore", "text"],
)
def test_inputs_are_cut_to_max_seq_length_as_sentence_transformers_cuts_them(tmp_path, structured, changes):
    if "processing_kwargs" in changes:  # keep the generation prompt the checkpoint was saved with
        changes["processing_kwargs"]["chat_template"]["add_generation_prompt"] = True
    reference = edited_copy(structured[0], tmp_path / "cut", **changes)
    llm = LLM(str(tmp_path / "cut"), runner="pooling", max_model_len=128)
    ids = assert_as_sentence_transformers(llm, reference)
    assert max(len(row) for row in ids) == changes["max_seq_length"]


def _write_config(directory: Path, config: dict) -> str:
    directory.mkdir(exist_ok=True)
    (directory / "sentence_bert_config.json").write_text(json.dumps(config))
    return str(directory)


def test_message_modality_settings_are_read_as_sentence_transformers_reads_them(tmp_path):
    message = {"method": "forward", "method_output_name": "last_hidden_state"}
    auto = _write_config(tmp_path / "auto", {"modality_config": {"message": {**message, "format": "auto"}}})
    # "auto": flat unless the template shows typed parts (sentence-transformers' rule)
    assert read_text_rendering(auto, QWEN3, embedding_checkpoint.CHATML).message_format == "flat"
    assert read_text_rendering(auto, QWEN3, embedding_checkpoint.CHATML_PARTS).message_format == "structured"
    sized = _write_config(
        tmp_path / "sized",
        {
            "modality_config": {"message": {**message, "format": "flat"}},
            "processing_kwargs": {"chat_template": {"restore_suffix": False, "enable_thinking": False}},
        },
    )
    assert read_text_rendering(sized, QWEN3, "{{ x }}") == TextRendering(
        "flat", {"enable_thinking": False}, None, False
    )
    assert read_text_rendering(str(tmp_path / "none"), QWEN3, "{{ x }}") == TextRendering()


def test_checkpoints_the_runner_cannot_feed_are_refused(tmp_path):
    message = {"method": "forward", "method_output_name": "last_hidden_state", "format": "flat"}
    no_template = _write_config(tmp_path / "a", {"modality_config": {"message": message}})
    with pytest.raises(UnsupportedModelError, match="no chat template"):
        read_text_rendering(no_template, QWEN3, None)
    images = _write_config(tmp_path / "b", {"modality_config": {"image": message}})
    with pytest.raises(UnsupportedModelError, match="neither text nor message"):
        read_text_rendering(images, QWEN3, "{{ x }}")


def test_a_text_the_template_refuses_fails_alone(tmp_path, flat):
    directory = tmp_path / "strict"
    shutil.copytree(flat[0], directory)
    refusing = "{% if messages[-1]['content'] == 'what' %}{{ raise_exception('no questions') }}{% endif %}"
    (directory / "chat_template.jinja").write_text(refusing + embedding_checkpoint.CHATML)
    llm = LLM(str(directory), runner="pooling", max_model_len=128)
    outputs = llm.embed(SENTENCES, use_tqdm=False)
    assert [output.error_code for output in outputs] == [200, 400, 200, 200]
    assert "no questions" in outputs[1].error_msg
    ours, _ = embedded([outputs[0], outputs[2], outputs[3]])
    expected = flat[1].encode([SENTENCES[0], SENTENCES[2], SENTENCES[3]], convert_to_numpy=True)
    assert cosine_distance(ours, expected).max() < COSINE
