"""The tokenizer rebuilt from GGUF metadata, against transformers' encodings of the same file."""

from __future__ import annotations

import os
from typing import Any

import pytest
from gguf import GGUFWriter

from fastdeploy.errors import UnsupportedModelError
from fastdeploy.input.gguf_tokenizer import GGUFTokenizerLoader, build_gguf_tokenizer
from fastdeploy.input.hf_tokenizer import HFTokenizer


def _expected_ids(entry: dict[str, Any]) -> list[int]:
    # transformers' GGUF converter drops SmolLM2's Digits pre-tokenizer; the fixture records the
    # original tokenizer's ids (Digits + ByteLevel, as on the hub and in llama.cpp) where they differ.
    return entry.get("ids_individual_digits", entry["ids"])


def test_encodings_match_reference(
    smollm2_tokenizer: HFTokenizer, tokenizer_reference: dict[str, Any]
) -> None:
    for entry in tokenizer_reference["encodings"]:
        assert smollm2_tokenizer.encode(entry["text"], add_special_tokens=False) == _expected_ids(entry), (
            entry["text"]
        )


def test_decodings_match_reference(
    smollm2_tokenizer: HFTokenizer, tokenizer_reference: dict[str, Any]
) -> None:
    for entry in tokenizer_reference["encodings"]:
        ids = _expected_ids(entry)
        assert smollm2_tokenizer.decode(ids, skip_special_tokens=False) == entry["decoded"], entry["text"]
        assert smollm2_tokenizer.decode(entry["ids"], skip_special_tokens=False) == entry["decoded"]


def test_vocabulary_pieces_match_reference(
    smollm2_tokenizer: HFTokenizer, tokenizer_reference: dict[str, Any]
) -> None:
    for entry in tokenizer_reference["encodings"]:
        assert [smollm2_tokenizer.id_to_token(i) for i in entry["ids"]] == entry["tokens"]


def test_digits_are_isolated_before_whitespace_runs(smollm2_tokenizer: HFTokenizer) -> None:
    """SmolLM2 splits every digit out first, so 2+ spaces before a number stay one token."""
    pieces = smollm2_tokenizer.backend.pre_tokenizer.pre_tokenize_str("x   42")
    assert [piece for piece, _ in pieces] == ["x", "ĠĠĠ", "4", "2"]
    assert smollm2_tokenizer.encode("x   42") == [104, 333, 36, 34]  # x, ĠĠĠ, 4, 2


def test_special_tokens_match_reference(
    smollm2_tokenizer: HFTokenizer, tokenizer_reference: dict[str, Any]
) -> None:
    special = tokenizer_reference["special_tokens"]
    assert smollm2_tokenizer.bos_token_id == special["bos_token_id"] == 1
    assert smollm2_tokenizer.eos_token_ids == frozenset({special["eos_token_id"]}) == frozenset({2})
    assert smollm2_tokenizer.vocab_size == special["vocab_size_with_added"] == 49152
    assert smollm2_tokenizer.add_bos_token is special["add_bos_token"] is False
    added = {token_id: content for token_id, content, is_special in special["added_tokens"] if is_special}
    assert smollm2_tokenizer.special_token_ids == frozenset(added)
    for token_id, content in added.items():
        assert smollm2_tokenizer.id_to_token(token_id) == content
    assert smollm2_tokenizer.template_special_tokens() == {
        "bos_token": special["bos_token"],
        "eos_token": special["eos_token"],
        "unk_token": special["unk_token"],
        "pad_token": special["pad_token"],
    }


def test_special_tokens_are_never_split(
    smollm2_tokenizer: HFTokenizer, tokenizer_reference: dict[str, Any]
) -> None:
    for token_id, content, _ in tokenizer_reference["special_tokens"]["added_tokens"]:
        assert smollm2_tokenizer.encode(content) == [token_id]
        ids = smollm2_tokenizer.encode(f"a{content}b")
        assert token_id in ids and ids.count(token_id) == 1, content
        assert smollm2_tokenizer.decode(ids, skip_special_tokens=True) == "ab"
        assert smollm2_tokenizer.decode(ids, skip_special_tokens=False) == f"a{content}b"


def test_no_bos_is_added_for_smollm2(smollm2_tokenizer: HFTokenizer) -> None:
    assert smollm2_tokenizer.encode("Hello world", add_special_tokens=True) == [19556, 905]


def test_prompts_of_smollm2_reference(
    smollm2_tokenizer: HFTokenizer, smollm2_reference: dict[str, Any]
) -> None:
    """The prompt ids transformers generated from, text prompts and chat prompts alike."""
    for case in smollm2_reference["cases"]:
        if case["kind"] == "chat":
            ids = smollm2_tokenizer.apply_chat_template(
                case["input"], tokenize=True, add_generation_prompt=True
            )
        else:
            ids = smollm2_tokenizer.encode(case["input"], add_special_tokens=False)
        assert ids == case["prompt_token_ids"], case["name"]
        assert smollm2_tokenizer.decode(case["output_token_ids"]) == case["output_text"], case["name"]


def test_chat_template_comes_from_metadata(
    smollm2_tokenizer: HFTokenizer, smollm2_reference: dict[str, Any]
) -> None:
    assert smollm2_tokenizer.chat_template == smollm2_reference["metadata"]["chat_template"]


def test_loader_can_load(smollm2_path: str, tmp_path: Any) -> None:
    loader = GGUFTokenizerLoader()
    assert loader.name == "gguf"
    assert loader.can_load(smollm2_path)
    assert not loader.can_load(os.path.dirname(smollm2_path))
    assert not loader.can_load(str(tmp_path / "missing.gguf"))


# --- synthetic vocabularies: the pre-tokenizer table and the error paths -------------------------


def _pieces(tokenizer: HFTokenizer, text: str) -> list[str]:
    return [piece for piece, _ in tokenizer.backend.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize(
    ("pre", "expected"),
    [
        ("gpt-2", ["Hi", "Ġ", "Ġ123", "Ġx", "'s", "!!"]),
        ("smollm", ["Hi", "ĠĠ", "1", "2", "3", "Ġx", "'s", "!!"]),
        ("llama-bpe", ["Hi", "Ġ", "Ġ", "123", "Ġx", "'s", "!!"]),
        ("qwen2", ["Hi", "Ġ", "Ġ", "1", "2", "3", "Ġx", "'s", "!!"]),
        ("default", ["Hi", "Ġ", "Ġ", "123", "Ġx", "'", "s", "!!"]),
    ],
)
def test_pre_tokenizer_table(tiny_gguf_metadata: dict[str, Any], pre: str, expected: list[str]) -> None:
    tiny_gguf_metadata["tokenizer.ggml.pre"] = pre
    assert _pieces(build_gguf_tokenizer(tiny_gguf_metadata), "Hi  123 x's!!") == expected


def test_llama3_ignores_merges_and_adds_bos(tiny_gguf_metadata: dict[str, Any]) -> None:
    gpt2 = build_gguf_tokenizer(tiny_gguf_metadata)
    tiny_gguf_metadata["tokenizer.ggml.pre"] = "llama-bpe"
    llama3 = build_gguf_tokenizer(tiny_gguf_metadata)
    hello = tiny_gguf_metadata["tokenizer.ggml.tokens"].index("hello")
    assert llama3.encode("hello", add_special_tokens=False) == [hello]
    assert len(gpt2.encode("hello")) > 1
    assert llama3.add_bos_token and llama3.encode("hello") == [llama3.bos_token_id, hello]
    tiny_gguf_metadata["tokenizer.ggml.add_bos_token"] = False
    assert build_gguf_tokenizer(tiny_gguf_metadata).encode("hello") == [hello]


def test_qwen2_normalizes_to_nfc(tiny_gguf_metadata: dict[str, Any]) -> None:
    tiny_gguf_metadata["tokenizer.ggml.pre"] = "qwen2"
    tokenizer = build_gguf_tokenizer(tiny_gguf_metadata)
    assert tokenizer.encode("e\u0301") == tokenizer.encode("\u00e9")


def test_merges_apply(tiny_gguf_metadata: dict[str, Any]) -> None:
    tokenizer = build_gguf_tokenizer(tiny_gguf_metadata)
    tokens = tiny_gguf_metadata["tokenizer.ggml.tokens"]
    assert tokenizer.encode(" the 123") == [tokens.index("Ġthe"), tokens.index("Ġ"), tokens.index("123")]


def test_control_and_user_defined_tokens(tiny_gguf_metadata: dict[str, Any]) -> None:
    tiny_gguf_metadata["tokenizer.ggml.eot_token_id"] = tiny_gguf_metadata["tokenizer.ggml.tokens"].index(
        "<|eot|>"
    )
    tokenizer = build_gguf_tokenizer(tiny_gguf_metadata)
    tokens = tiny_gguf_metadata["tokenizer.ggml.tokens"]
    end, eot, think = tokens.index("<|end|>"), tokens.index("<|eot|>"), tokens.index("<think>")
    ids = tokenizer.encode("hi<think>hi<|end|>")
    assert ids == [tokens.index("hi"), think, tokens.index("hi"), end]
    assert tokenizer.eos_token_ids == frozenset({end, eot})
    assert think not in tokenizer.special_token_ids and end in tokenizer.special_token_ids
    assert tokenizer.decode(ids) == "hi<think>hi"
    assert tokenizer.vocab_size == len(tokens)


def test_raw_utf8_tokens_are_respelled(tiny_gguf_metadata: dict[str, Any]) -> None:
    """A token stored as raw UTF-8 ("你") is found under its byte spelling ("ä½ł")."""
    tokens = tiny_gguf_metadata["tokenizer.ggml.tokens"] = [
        *tiny_gguf_metadata["tokenizer.ggml.tokens"],
        "ä½",
        "你",
    ]
    tiny_gguf_metadata["tokenizer.ggml.token_type"] = [*tiny_gguf_metadata["tokenizer.ggml.token_type"], 1, 1]
    tiny_gguf_metadata["tokenizer.ggml.merges"] = [
        *tiny_gguf_metadata["tokenizer.ggml.merges"],
        "ä ½",
        "ä½ ł",
    ]
    tokenizer = build_gguf_tokenizer(tiny_gguf_metadata)
    assert tokenizer.encode("你") == [len(tokens) - 1]
    assert tokenizer.decode([len(tokens) - 1]) == "你"


def test_a_token_listed_twice_keeps_its_first_id(tiny_gguf_metadata: dict[str, Any], caplog) -> None:
    """As the per-token build did (and transformers' converter): the first id wins, with a warning."""
    tokens = tiny_gguf_metadata["tokenizer.ggml.tokens"]
    first = tokens.index("hi")
    tiny_gguf_metadata["tokenizer.ggml.tokens"] = [*tokens, "hi"]
    tiny_gguf_metadata["tokenizer.ggml.token_type"] = [*tiny_gguf_metadata["tokenizer.ggml.token_type"], 1]
    with caplog.at_level("WARNING"):
        tokenizer = build_gguf_tokenizer(tiny_gguf_metadata)
    assert tokenizer.encode("hi") == [first]
    assert "1 duplicate vocabulary entries" in caplog.text


@pytest.mark.parametrize("bad", ["hello", "h e l"])
def test_a_merge_that_is_not_two_tokens_is_named(tiny_gguf_metadata: dict[str, Any], bad: str) -> None:
    tiny_gguf_metadata["tokenizer.ggml.merges"] = [*tiny_gguf_metadata["tokenizer.ggml.merges"], bad]
    with pytest.raises(UnsupportedModelError, match=f"BPE merge '{bad}' is not two tokens"):
        build_gguf_tokenizer(tiny_gguf_metadata)


def test_unknown_pre_tokenizer_is_named(tiny_gguf_metadata: dict[str, Any]) -> None:
    tiny_gguf_metadata["tokenizer.ggml.pre"] = "deepseek-coder"
    with pytest.raises(UnsupportedModelError, match="'deepseek-coder'.*supported: "):
        build_gguf_tokenizer(tiny_gguf_metadata)


def test_unknown_tokenizer_model_is_refused(tiny_gguf_metadata: dict[str, Any]) -> None:
    """SentencePiece ('llama') vocabularies are built now (test_gguf_sentencepiece.py); others are not."""
    tiny_gguf_metadata["tokenizer.ggml.model"] = "rwkv"
    with pytest.raises(UnsupportedModelError, match="'rwkv' is not supported"):
        build_gguf_tokenizer(tiny_gguf_metadata)


def test_missing_vocabulary(tiny_gguf_metadata: dict[str, Any]) -> None:
    del tiny_gguf_metadata["tokenizer.ggml.merges"]
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.merges is missing"):
        build_gguf_tokenizer(tiny_gguf_metadata)


def test_inconsistent_merges(tiny_gguf_metadata: dict[str, Any]) -> None:
    tiny_gguf_metadata["tokenizer.ggml.merges"] = ["x yz_not_a_token"]
    with pytest.raises(UnsupportedModelError, match="inconsistent"):
        build_gguf_tokenizer(tiny_gguf_metadata)


def test_loads_a_written_gguf_file(tiny_gguf_metadata: dict[str, Any], tmp_path: Any) -> None:
    """End to end through a real file written by the `gguf` package."""
    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tiny_gguf_metadata["tokenizer.ggml.tokens"])
    writer.add_token_types(tiny_gguf_metadata["tokenizer.ggml.token_type"])
    writer.add_token_merges(tiny_gguf_metadata["tokenizer.ggml.merges"])
    writer.add_bos_token_id(tiny_gguf_metadata["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(tiny_gguf_metadata["tokenizer.ggml.eos_token_id"])
    writer.add_chat_template(tiny_gguf_metadata["tokenizer.chat_template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loader = GGUFTokenizerLoader()
    assert loader.can_load(str(path))
    tokenizer = loader.load(str(path))
    end = tiny_gguf_metadata["tokenizer.ggml.eos_token_id"]
    assert tokenizer.eos_token_ids == frozenset({end})
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True) == [
        tiny_gguf_metadata["tokenizer.ggml.bos_token_id"],
        tiny_gguf_metadata["tokenizer.ggml.tokens"].index("hi"),
        end,
    ]
